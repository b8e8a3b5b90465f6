#!/bin/bash
# The demo `make run` runs against a live server (curl and jq only): submit a real
# stories260K compression job, follow its events as they happen (long-poll with a
# cursor), print the report's key numbers, then download the checkpoint and verify its
# sha-256 against the artifact record, the ETag and the export manifest.
# Usage: scripts/demo.sh [URL]   (default http://127.0.0.1:8080). Models and text are
# server paths under the server's data roots (run.sh copies them into ./var).
# Exit status: 0 when the job succeeded and the checkpoint verified, 1 otherwise.
set -u
URL=${1:-http://127.0.0.1:8080}
command -v jq >/dev/null || { echo "demo.sh: needs jq" >&2; exit 1; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\033[31mdemo: %s\033[0m\n' "$*" >&2; exit 1; }

# A uniform (hidden-size) search keeps the result exportable as a LlamaForCausalLM HF
# checkpoint; a parameter limit keeps the demo independent of the machine's load.
spec='{"name": "demo-stories260K",
  "model": {"path": "models/stories260K/stories260K.bin", "tokenizer": "models/stories260K/tok512.bin"},
  "target": {"device": "cpu", "precision": "fp32", "workload": {"batch_size": 1, "prompt_tokens": 32, "output_tokens": 8}},
  "constraints": {"params": 200000},
  "search_space": {"hidden": true, "heads": false, "ffn": false, "depth": false},
  "budgets": {"search_tokens": 8192, "distill_tokens": 16384},
  "data": {"calibration": "data/tinystories/validation_100.txt", "distillation": "data/tinystories/validation_100.txt"},
  "evaluation": {"tasks": ["arc_easy", "lambada_openai"], "limit": 20},
  "export": ["hf", "gguf"]}'

say "POST /v1/jobs (stories260K under a 200k-parameter limit)"
job=$(curl -sS -X POST "$URL/v1/jobs" -H 'Content-Type: application/json' \
      -H "Idempotency-Key: demo-$(date +%s%N)" -d "$spec") || fail "POST failed"
id=$(jq -r '.id // empty' <<<"$job")
[ -n "$id" ] || fail "the job was refused: $job"
echo "job $id: $(jq -r .status <<<"$job"), stages $(jq -c .stages <<<"$job")"

say "events of $id (long-poll, cursor)"
after=""
while :; do
    # the status is read before the page, so a terminal job's last events are in it
    st=$(curl -sS "$URL/v1/jobs/$id" | jq -r .status)
    page=$(curl -sS "$URL/v1/jobs/$id/events?limit=100&wait=30${after:+&after=$after}") || fail "events failed"
    jq -r '.data[] | "  \(.type): \(.message)"' <<<"$page"
    last=$(jq -r '.last_id // empty' <<<"$page")
    [ -n "$last" ] && after=$last
    case $st in succeeded|failed|cancelled)
        [ "$(jq -r .has_more <<<"$page")" = true ] || break ;;
    esac
done
j=$(curl -sS "$URL/v1/jobs/$id")
[ "$(jq -r .status <<<"$j")" = succeeded ] || fail "the job ended $(jq -c '{status, stage, error}' <<<"$j")"

say "report (GET /v1/jobs/$id/report; HTML at /v1/jobs/$id/report.html)"
curl -sS "$URL/v1/jobs/$id/report" | jq '{
  limits, params: {parent: .parent.params, result: .result.params},
  result_arch: .result.arch.hidden_size, layers: (.result.arch.layers | length),
  accuracy: {parent: .parent.average, result: .result.average},
  perplexity: {parent: .parent.perplexity, result: .result.perplexity},
  memory, selection_tokens: .search.selection_tokens, distill_tokens: .distillation.tokens,
  stages: [.stages[] | "\(.name) \(.wall_s | . * 10 | round / 10) s"]}'

say "download and verify the checkpoint"
arts=$(curl -sS "$URL/v1/jobs/$id/artifacts")
jq -r '.data[] | "  \(.name)  \(.size_bytes) B  sha256 \(.sha256)"' <<<"$arts"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -sS -D "$tmp/headers" -o "$tmp/model-hf.tar" "$URL/v1/jobs/$id/artifacts/model-hf.tar" || fail "download failed"
curl -sS -o "$tmp/manifest.json" "$URL/v1/jobs/$id/artifacts/export-manifest.json" || fail "download failed"
got=$(sha256sum "$tmp/model-hf.tar" | cut -d' ' -f1)
want=$(jq -r '.data[] | select(.name == "model-hf.tar") | .sha256' <<<"$arts")
inman=$(jq -r '.artifacts[] | select(.name == "model-hf.tar") | .sha256' "$tmp/manifest.json")
etag=$(sed -n 's/^[Ee][Tt][Aa][Gg]: *"\{0,1\}\([0-9a-f]*\)"\{0,1\}.*/\1/p' "$tmp/headers" | tr -d '\r')
echo "  downloaded model-hf.tar: sha256 $got"
echo "  artifact record:         sha256 $want"
echo "  export manifest:         sha256 $inman"
echo "  ETag:                           $etag"
[ "$got" = "$want" ] && [ "$got" = "$inman" ] && [ "$got" = "$etag" ] || fail "sha-256 mismatch"
tar -tf "$tmp/model-hf.tar" | sed 's/^/  /'
echo "checkpoint verified"
