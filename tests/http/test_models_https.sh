#!/bin/bash
# POST /v1/models {url: https://...}: the real server downloads stories260K over TLS from
# a local Python https server whose certificate (IP SAN 127.0.0.1) is signed by a
# throwaway CA made here with the openssl CLI. Without --models-ca-file the download
# fails at once (one connection, no retries) with an error that says the certificate
# could not be verified and suggests --models-ca-file; with --models-ca-file CA.pem it
# is ready, digest-checked and cached at DATA/models/SHA/FILE; host names are still
# checked (https://localhost fails); a CA file that is missing, holds no certificate or
# comes from AC_MODELS_CA_FILE and is missing stops the server at start-up, naming it.
set -eu
command -v openssl >/dev/null || { echo "SKIP: the openssl CLI is not installed"; exit 0; }
PY=${AC_PYTHON:-python3}
SRC=$AC_SHARED/data/models/stories260K
SHA=$(sha256sum "$SRC/stories260K.bin" | cut -d' ' -f1)
WRONG=$(sha256sum "$SRC/tok512.bin" | cut -d' ' -f1)
SIZE=$(stat -c %s "$SRC/stories260K.bin")
source "$(dirname "$0")/acserver.sh"

# ---- a throwaway CA, a server certificate for 127.0.0.1 it signs, and a second CA -----
mkca() {   # NAME
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=autocompress test $1" -keyout "$tmp/$1.key" -out "$tmp/$1.pem" \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        2>"$tmp/openssl.log" || { cat "$tmp/openssl.log"; fail "openssl could not make $1"; }
}
mkca ca
mkca otherca
printf '%s\n' subjectAltName=IP:127.0.0.1 basicConstraints=CA:FALSE keyUsage=critical,digitalSignature \
    extendedKeyUsage=serverAuth > "$tmp/srv.ext"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$tmp/srv.key" -out "$tmp/srv.csr" 2>"$tmp/openssl.log" &&
openssl x509 -req -in "$tmp/srv.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" -set_serial 2 -days 2 \
    -extfile "$tmp/srv.ext" -out "$tmp/srv.pem" 2>>"$tmp/openssl.log" ||
    { cat "$tmp/openssl.log"; fail "openssl could not sign the server certificate"; }
openssl verify -CAfile "$tmp/ca.pem" "$tmp/srv.pem" >/dev/null || fail "the test certificate does not verify"

# ---- an https file server: logs "connection" per accepted TCP connection ---------------
mkdir -p "$tmp/www"
cp "$SRC/stories260K.bin" "$tmp/www/"
"$PY" -u - "$tmp/www" "$tmp/srv.pem" "$tmp/srv.key" > "$tmp/www.log" 2>&1 <<'PYEOF' &
import functools, http.server, ssl, sys
root, cert, key = sys.argv[1:4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
class TLSServer(http.server.ThreadingHTTPServer):
    def get_request(self):
        sock, addr = self.socket.accept()
        print("connection", flush=True)
        sock.settimeout(10)
        try:
            return ctx.wrap_socket(sock, server_side=True), addr   # the handshake happens here
        except (ssl.SSLError, OSError) as e:
            print("handshake failed:", e, flush=True)
            sock.close()
            raise
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
srv = TLSServer(("127.0.0.1", 0), handler)
print("port", srv.server_address[1], flush=True)
srv.serve_forever()
PYEOF
helpers+=($!)
FP=""
for _ in $(seq 100); do
    FP=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$tmp/www.log" | head -1)
    [ -n "$FP" ] && break
    sleep 0.1
done
[ -n "$FP" ] || { cat "$tmp/www.log"; fail "the https file server did not start"; }
URL=https://127.0.0.1:$FP/stories260K.bin
connections() { grep -c '^connection$' "$tmp/www.log" || true; }


# ---- a: the system CA store does not know the test CA: failed at once ----------------
start_server "$tmp/var1" --allow-private-model-hosts
grep -q 'model fetcher on (https, .*CAs: system store, private addresses too)' "$tmp/server.log" || fail "fetcher log line"
before=$(connections)
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\"}"
expect 202 ".status == \"fetching\" and .url == \"$URL\""
ID=$(echo "$BODY" | jq -r .id)
wait_status "$ID" failed 20
echo "failed after ${WAITED}s: $(echo "$BODY" | jq -r .error.message)"
expect 200 '.error.code == "fetch_failed" and (.error.message | contains("certificate could not be verified")
             and contains("system CA store") and contains("--models-ca-file"))'
[ "$(($(connections) - before))" = 1 ] || fail "expected one connection (no retries), got $(($(connections) - before))"
grep -q 'handshake failed' "$tmp/www.log" || fail "the https server saw no failed handshake"
! grep -q '"GET /stories260K.bin' "$tmp/www.log" || fail "the file was requested over an unverified connection"
[ ! -e "$tmp/var1/models/$SHA/stories260K.bin" ] && [ ! -e "$tmp/var1/models/$SHA/stories260K.bin.part" ] ||
    fail "a file was left for the failed model"
stop_server

# ---- b: --models-ca-file CA.pem: ready, verified, cached ------------------------------
DATA=$tmp/var2
start_server "$DATA" --models-ca-file "$tmp/ca.pem" --allow-private-model-hosts
grep -q "model fetcher on (https, .*CAs: $tmp/ca.pem, private addresses too)" "$tmp/server.log" || fail "fetcher log line names no CA file"
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\", \"name\": \"stories-tls\"}"
expect 202 '.status == "fetching"'
ID=$(echo "$BODY" | jq -r .id)
wait_status "$ID" ready 30
expect 200 ".sha256 == \"$SHA\" and .bytes_done == $SIZE and .bytes_total == $SIZE and .format == \"llama2c\"
             and .error == null"
CACHED=$(echo "$BODY" | jq -r .path)
[ "$CACHED" = "$DATA/models/$SHA/stories260K.bin" ] || fail "cache path $CACHED"
[ "$(sha256sum "$CACHED" | cut -d' ' -f1)" = "$SHA" ] || fail "cached file digest"
[ ! -e "$CACHED.part" ] || fail ".part left behind"
"$AC_BIN" inspect "$CACHED" | grep -q '^layers: *5$' || fail "the cached model does not load"
[ "$(grep -c '"GET /stories260K.bin HTTP/1.1" 200' "$tmp/www.log")" = 1 ] || fail "expected one download"

# the host name is still checked: the certificate is for 127.0.0.1, not "localhost"
before=$(connections)
req POST /v1/models "{\"url\": \"https://localhost:$FP/stories260K.bin\", \"sha256\": \"$WRONG\"}"
expect 202 '.status == "fetching"'
wait_status "$(echo "$BODY" | jq -r .id)" failed 20
expect 200 ".error.message | contains(\"certificate could not be verified against the CA file $tmp/ca.pem\")
             and (contains(\"sha256 mismatch\") | not) and (contains(\"--models-ca-file\") | not)"
echo "localhost: $(echo "$BODY" | jq -r .error.message)"
[ "$(($(connections) - before))" = 1 ] || fail "localhost: expected one connection, got $(($(connections) - before))"
stop_server

# a CA file from another CA: fails the same way, naming that file
start_server "$tmp/var3" --models-ca-file "$tmp/otherca.pem" --allow-private-model-hosts
req POST /v1/models "{\"url\": \"$URL\", \"sha256\": \"$SHA\"}"
expect 202 '.status == "fetching"'
wait_status "$(echo "$BODY" | jq -r .id)" failed 20
expect 200 ".error.message | contains(\"certificate could not be verified against the CA file $tmp/otherca.pem\")"
echo "other CA: $(echo "$BODY" | jq -r .error.message)"
stop_server

# ---- c: a CA file that cannot be used stops the server at start-up --------------------
refuses() {   # WHAT-IN-STDERR ARGS... (env AC_MODELS_CA_FILE may be set by the caller)
    local want=$1; shift
    set +e
    timeout 20 "$AC_BIN" serve --listen 127.0.0.1:0 --data-dir "$tmp/var4" "$@" > "$tmp/refused.log" 2>&1
    local rc=$?
    set -e
    [ "$rc" != 0 ] && [ "$rc" != 124 ] ||
        fail "the server did not refuse to start (exit $rc): $(cat "$tmp/refused.log")"
    grep -qF -- "$want" "$tmp/refused.log" || fail "no '$want' in: $(cat "$tmp/refused.log")"
    echo "refused (exit $rc): $(cat "$tmp/refused.log")"
    ! grep -q '"msg":"listening"' "$tmp/refused.log" || fail "the server listened"
}
refuses "--models-ca-file: CA file /nonexistent/ca.pem: No such file or directory" --models-ca-file /nonexistent/ca.pem
refuses "CA file $tmp/srv.key: holds no PEM certificate" --models-ca-file "$tmp/srv.key"
refuses "CA file $tmp: not a regular file" --models-ca-file "$tmp"
AC_MODELS_CA_FILE=/nonexistent/env.pem refuses "CA file /nonexistent/env.pem"
echo ok
