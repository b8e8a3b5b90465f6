#!/bin/bash
# POST /v1/models {url, sha256}: the real server downloads stories260K from a local HTTP
# server in the background (202, status fetching -> ready), verified against its sha256
# and cached at DATA/models/SHA/FILE; the same sha256 again returns the same model; a wrong
# sha256 fails with both digests named; jobs get a 422 naming the state of a model that
# is fetching or failed; a redirect whose target cannot be reached yet is retried (not
# failed for the redirect's 302) and completes once the target serves; SIGTERM during a
# stalled download is prompt and the model is
# still fetching after a restart; http:// needs --allow-http-models, this host's own
# network --allow-private-model-hosts (else no request reaches it); --max-model-bytes
# fails an oversized download; a tokenizer that is not a regular file is a 422. Responses
# are validated against openapi.yaml's Model.
set -eu
PY=${AC_PYTHON:-python3}
SRC=$AC_SHARED/data/models/stories260K
SHA=$(sha256sum "$SRC/stories260K.bin" | cut -d' ' -f1)
WRONG=$(sha256sum "$SRC/tok512.bin" | cut -d' ' -f1)
SIZE=$(stat -c %s "$SRC/stories260K.bin")
export AC_TEST_STAGES=1   # the jobs below run test_sleep
source "$(dirname "$0")/acserver.sh"
HERE=$(cd "$(dirname "$0")" && pwd)

# a file server (python's http.server) and a server that accepts and never answers
mkdir -p "$tmp/www"
cp "$SRC/stories260K.bin" "$tmp/www/"
"$PY" -u -m http.server 0 --bind 127.0.0.1 --directory "$tmp/www" > "$tmp/www.log" 2>&1 &
helpers+=($!)
"$PY" -u -c 'import socket, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(64)
print(s.getsockname()[1], flush=True); time.sleep(600)' > "$tmp/stall.port" &
helpers+=($!)
FP=""; STALL=""
for _ in $(seq 100); do
    FP=$(sed -n 's/.* port \([0-9]*\) .*/\1/p' "$tmp/www.log" | head -1)
    STALL=$(head -1 "$tmp/stall.port")
    [ -n "$FP" ] && [ -n "$STALL" ] && break
    sleep 0.1
done
[ -n "$FP" ] && [ -n "$STALL" ] || fail "helper servers did not start"

keep() { echo "$BODY" >> "$tmp/models.jsonl"; }   # for the schema check at the end

# ---- a server that accepts http:// model URLs ------------------------------------------
DATA=$tmp/var
start_server "$DATA" --allow-http-models --allow-private-model-hosts
cp "$SRC/tok512.bin" "$DATA/models/tok512.bin"
URL=http://127.0.0.1:$FP/stories260K.bin

# URLs shorter than a scheme: a 422, and nothing read past them (ASan found the read)
for short in "" "x" "https:"; do
    req POST /v1/models "{\"url\": \"$short\", \"sha256\": \"$SHA\"}"
    expect 422 '.errors[0].pointer == "/url"'
done

# credentials in the URL: refused, never stored (models are listed to every reader)
req POST /v1/models "{\"url\": \"http://user:secret@127.0.0.1:$FP/stories260K.bin\", \"sha256\": \"$SHA\"}"
expect 422 '.errors[0].pointer == "/url" and (.errors[0].message | contains("credentials"))'

# a tokenizer that is a FIFO or a folder is refused now, as for a path registration (it was
# accepted, and the job's load stage failed later naming --tokenizer)
mkfifo "$DATA/models/tok.fifo"
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\", \"tokenizer\": \"models/tok.fifo\"}"
expect 422 '.errors[0].pointer == "/tokenizer" and (.errors[0].message | contains("a FIFO"))'
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\", \"tokenizer\": \"models\"}"
expect 422 '.errors[0].pointer == "/tokenizer" and (.errors[0].message | contains("a directory"))'

req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\", \"name\": \"stories\", \"tokenizer\": \"models/tok512.bin\"}"
expect 202 ".status == \"fetching\" and .url == \"$URL\" and .sha256 == \"$SHA\" and .error == null"
keep
ID=$(echo "$BODY" | jq -r .id)
wait_status "$ID" ready
expect 200 ".bytes_done == $SIZE and .bytes_total == $SIZE and .format == \"llama2c\" and .name == \"stories\""
keep
CACHED=$(echo "$BODY" | jq -r .path)
[ "$CACHED" = "$DATA/models/$SHA/stories260K.bin" ] || fail "cache path $CACHED"
[ "$(sha256sum "$CACHED" | cut -d' ' -f1)" = "$SHA" ] || fail "cached file digest"
[ ! -e "$CACHED.part" ] || fail ".part left behind"
"$AC_BIN" inspect "$CACHED" | grep -q '^layers: *5$' || fail "the cached model does not load"
[ "$(grep -c '"GET /stories260K.bin' "$tmp/www.log")" = 1 ] || fail "expected one download"

# the same sha256 (any case) again: the same model, no second download
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"${SHA^^}\"}"
expect 200 ".id == \"$ID\" and .status == \"ready\""
req GET "/v1/models?limit=100"
expect 200 "[.data[] | select(.sha256 == \"$SHA\")] | length == 1"
[ "$(grep -c '"GET /stories260K.bin' "$tmp/www.log")" = 1 ] || fail "downloaded twice"

# jobs can reference it by id or by url + sha256
SPEC='"constraints": {"latency_ms": 50}, "x_test_pipeline": ["test_sleep"]'
req POST /v1/jobs "{\"model\": {\"id\": \"$ID\"}, $SPEC}"
expect 201 ".id | startswith(\"job_\")"
req POST /v1/jobs "{\"model\": {\"url\": \"$URL\", \"sha256\": \"$SHA\"}, $SPEC}"
expect 201 ".id | startswith(\"job_\")"

# a file whose bytes are another format than its name says: the probe decides, and fails it
"$AC_BIN" export "$SRC/stories260K.bin" --out "$tmp/fake.gguf" --format gguf --dtype fp32 >/dev/null
mv "$tmp/fake.gguf" "$tmp/www/fake.bin"
FAKE_SHA=$(sha256sum "$tmp/www/fake.bin" | cut -d' ' -f1)
req POST /v1/models "{\"url\": \"http://127.0.0.1:$FP/fake.bin\", \"sha256\": \"$FAKE_SHA\"}"
expect 202 '.status == "fetching"'
FAKE=$(echo "$BODY" | jq -r .id)
wait_status "$FAKE" failed
expect 200 '.error.code == "fetch_failed" and (.error.message | contains("a gguf model, not the llama2c"))'

# a wrong sha256: failed, both digests named, nothing cached
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$WRONG\"}"
expect 202 '.status == "fetching"'
BAD=$(echo "$BODY" | jq -r .id)
wait_status "$BAD" failed
expect 200 ".error.code == \"fetch_failed\" and (.error.message | contains(\"sha256 mismatch\") and contains(\"$SHA\") and contains(\"$WRONG\"))"
keep
[ ! -e "$DATA/models/$WRONG/stories260K.bin" ] && [ ! -e "$DATA/models/$WRONG/stories260K.bin.part" ] ||
    fail "a file was left for the failed model"
req POST /v1/jobs "{\"model\": {\"id\": \"$BAD\"}, $SPEC}"
expect 422 "[.errors[] | select(.pointer == \"/model/id\" and (.message | contains(\"failed to fetch\")))] | length == 1"

# a redirect whose target cannot be reached yet (as a CDN that times out): retried, not
# failed for the redirect's own 302; once the target serves, the download completes
FREE=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -u -c 'import http.server, sys
class R(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", "http://127.0.0.1:%s/stories260K.bin" % sys.argv[1])
        self.send_header("Content-Length", "0")
        self.end_headers()
s = http.server.HTTPServer(("127.0.0.1", 0), R)
print(s.server_address[1], flush=True)
s.serve_forever()' "$FREE" > "$tmp/redir.log" 2>&1 &
helpers+=($!)
for _ in $(seq 100); do RP=$(head -1 "$tmp/redir.log"); [ -n "$RP" ] && break; sleep 0.1; done
[ -n "$RP" ] || fail "the redirecting server did not start"
mkdir -p "$tmp/www2"
# another model (the smallest llama2.c checkpoint the probe takes), so a new download
"$PY" -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<7i", 8, 16, 1, 2, 2, 32, 4) + b"\0" * 3744)' \
    "$tmp/www2/stories260K.bin"
REDIR_SHA=$(sha256sum "$tmp/www2/stories260K.bin" | cut -d' ' -f1)
req POST /v1/models "{\"url\": \"http://127.0.0.1:$RP/m/stories260K.bin\", \"sha256\": \"$REDIR_SHA\"}"
expect 202 '.status == "fetching"'
REDIR=$(echo "$BODY" | jq -r .id)
for _ in $(seq 100); do grep -q '"GET /m/stories260K.bin' "$tmp/redir.log" && break; sleep 0.1; done
grep -q '"GET /m/stories260K.bin' "$tmp/redir.log" || fail "no request reached the redirecting server"
sleep 0.5   # the redirect's target refused the connection
req GET "/v1/models/$REDIR"
expect 200 '.status == "fetching"'
"$PY" -u -m http.server "$FREE" --bind 127.0.0.1 --directory "$tmp/www2" > "$tmp/www2.log" 2>&1 &
helpers+=($!)
wait_status "$REDIR" ready 40
expect 200 ".sha256 == \"$REDIR_SHA\" and .format == \"llama2c\""
grep -q '"GET /stories260K.bin' "$tmp/www2.log" || fail "the retry did not reach the redirect's target"

# a presigned URL (its signature in the query): the model's url and its error show the
# parameters' names, never their values, to anyone who can read models
req POST /v1/models "{\"url\": \"http://127.0.0.1:$FP/gone.bin?X-Amz-Credential=AKIAX%2F1&X-Amz-Signature=s3cr3tsig&dl\", \"sha256\": \"$WRONG\"}"
expect 202 '.status == "fetching" and (.url | contains("s3cr3tsig") or contains("AKIAX") | not) and (.url | contains("X-Amz-Signature="))'
keep
SIGNED=$(echo "$BODY" | jq -r .id)
wait_status "$SIGNED" failed
expect 200 '(.error.message | contains("HTTP 404") and (contains("s3cr3tsig") | not)) and (.url | contains("s3cr3tsig") | not)'
keep
req GET "/v1/models?limit=100"
echo "$BODY" | grep -q s3cr3tsig && fail "the model list shows a URL's signature"
grep -q '"GET /gone.bin?X-Amz-Credential=AKIAX%2F1&X-Amz-Signature=s3cr3tsig&dl' "$tmp/www.log" ||
    fail "the download did not ask for the URL as registered"

# a download that stalls: the model stays fetching and jobs are told so
STALLSHA=$(printf 'c%.0s' $(seq 64))
req POST /v1/models "{\"url\": \"http://127.0.0.1:$STALL/big.gguf\", \"sha256\": \"$STALLSHA\", \"size_bytes\": 123456}"
expect 202 '.status == "fetching" and .format == "gguf" and .bytes_total == 123456'
keep
SLOW=$(echo "$BODY" | jq -r .id)
sleep 0.5
req POST /v1/jobs "{\"model\": {\"id\": \"$SLOW\"}, $SPEC}"
expect 422 "[.errors[] | select(.pointer == \"/model/id\" and (.message | contains(\"still fetching\")))] | length == 1"

# invalid registrations
req POST /v1/models "{\"url\": \"$URL\"}"
expect 400 '[.errors[] | select(.pointer == "/sha256")] | length == 1'
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"abc\"}"
expect 422 '[.errors[] | select(.pointer == "/sha256")] | length == 1'
req POST /v1/models "{\"url\": \"ftp://127.0.0.1/x.bin\", \"sha256\": \"$SHA\"}"
expect 422 '[.errors[] | select(.pointer == "/url")] | length == 1'
req POST /v1/models "{\"url\": \"http://127.0.0.1:$FP/notes.txt\", \"sha256\": \"$SHA\"}"
expect 422 '.errors[0].message | contains(".gguf")'
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\", \"path\": \"models/tok512.bin\"}"
expect 422 '.errors[0].message | contains("exactly one of path or url")'
req POST /v1/models "{\"path\": \"models/tok512.bin\", \"sha256\": \"$SHA\"}"
expect 400 '[.errors[] | select(.pointer == "/sha256")] | length == 1'

# SIGTERM while a download stalls: prompt; after a restart the model is still fetching
stop_server
echo "stop with a stalled download: ${STOP_S}s"
[ "$(echo "$STOP_S < 8" | bc)" = 1 ] || fail "shutdown took ${STOP_S}s"
start_server "$DATA" --allow-http-models --allow-private-model-hosts
req GET "/v1/models/$SLOW"
expect 200 '.status == "fetching"'
req GET "/v1/models/$ID"
expect 200 '.status == "ready"'
stop_server

# ---- the defaults: https only; and a size cap ------------------------------------------
start_server "$tmp/var2"
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\"}"
expect 422 '.errors[0].message | contains("--allow-http-models")'
stop_server
start_server "$tmp/var3" --allow-http-models --allow-private-model-hosts --max-model-bytes 1000
req POST /v1/models "{\"url\": \"https://example.invalid/m.gguf\", \"sha256\": \"$SHA\", \"size_bytes\": 5000}"
expect 422 '[.errors[] | select(.pointer == "/size_bytes" and (.message | contains("--max-model-bytes")))] | length == 1'
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\"}"
expect 202 '.status == "fetching"'
CAP=$(echo "$BODY" | jq -r .id)
wait_status "$CAP" failed
expect 200 ".error.message | contains(\"$SIZE bytes is larger than the limit of 1000 bytes\")"
keep
stop_server

# ---- without --allow-private-model-hosts no download reaches this host's own network -----
start_server "$tmp/var4" --allow-http-models
GETS=$(grep -c '"GET /stories260K.bin' "$tmp/www.log")
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$WRONG\"}"
expect 202 '.status == "fetching"'
PRIV=$(echo "$BODY" | jq -r .id)
wait_status "$PRIV" failed
expect 200 '.error.message | (contains("refused to connect to 127.0.0.1") and contains("--allow-private-model-hosts")
                              and (contains("sha256 mismatch") | not))'
[ "$(grep -c '"GET /stories260K.bin' "$tmp/www.log")" = "$GETS" ] || fail "a request reached this host's server"
stop_server

# ---- every model response above matches the OpenAPI Model schema ----------------------
"$PY" - "$HERE/../../openapi/openapi.yaml" "$tmp/models.jsonl" <<'PYEOF'
import json, subprocess, sys
import yaml
try:
    import jsonschema  # noqa: F401
except ImportError:  # first run in a fresh venv (as test_openapi_contract.py does)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "jsonschema"], check=True)
from jsonschema import Draft202012Validator
doc = yaml.safe_load(open(sys.argv[1]))
v = Draft202012Validator({"$ref": "#/components/schemas/Model", "components": doc["components"]})
rows = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
assert len(rows) == 7, len(rows)
for r in rows:
    errs = list(v.iter_errors(r))
    assert not errs, (r, [e.message for e in errs])
print("schema ok for", len(rows), "models")
PYEOF
echo ok
