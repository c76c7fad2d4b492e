#!/bin/sh
# Enqueue one Conveyor job and print its tokens as they arrive, with nothing but redis-cli and jq-free sh.
#   REDIS_URL=redis://localhost:6379/0 ./stream.sh "Once upon a time" [max_tokens]
# Reads the job's output stream from its start, so a late start loses nothing (docs/protocol.md).
set -eu
URL="${REDIS_URL:-redis://localhost:6379/0}"
PREFIX="${CONVEYOR_PREFIX:-conveyor}"
PROMPT="${1:-Hello from redis-cli}"
MAX_TOKENS="${2:-32}"
ID="${JOB_ID:-sh-$$-$(date +%s)}"
# The prompt goes into JSON: escape backslashes and double quotes.
ESCAPED=$(printf '%s' "$PROMPT" | sed 's/\\/\\\\/g; s/"/\\"/g')

redis-cli -u "$URL" XADD "$PREFIX:requests" '*' job \
  "{\"id\":\"$ID\",\"prompt\":\"$ESCAPED\",\"max_tokens\":$MAX_TOKENS,\"temperature\":0}" >/dev/null

LAST=0
while :; do
  # --no-raw-less output: one line per reply element; entry ids, the field name, then the event JSON.
  REPLY=$(redis-cli -u "$URL" --raw XREAD COUNT 100 BLOCK 30000 STREAMS "$PREFIX:out:$ID" "$LAST")
  [ -n "$REPLY" ] || { echo "no events for $ID within 30 s" >&2; exit 1; }
  # Lines: key, then per entry: id, "event", json.
  EVENTS=$(printf '%s\n' "$REPLY" | sed -n '2,$p')
  while IFS= read -r ENTRY_ID && IFS= read -r _FIELD && IFS= read -r EVENT; do
    LAST="$ENTRY_ID"
    case "$EVENT" in
      *'"type":"token"'*)
        # Print the "text" value (the JSON string is unescaped for the common cases).
        printf '%s' "$EVENT" | sed 's/.*"text":"\(\([^"\\]\|\\.\)*\)".*/\1/; s/\\n/\n/g; s/\\"/"/g; s/\\\\/\\/g' | tr -d '\n' ;;
      *'"type":"done"'*)
        printf '\n%s\n' "$EVENT"; exit 0 ;;
      *)
        printf '\n%s\n' "$EVENT" >&2; exit 1 ;;
    esac
  done <<END
$EVENTS
END
done
