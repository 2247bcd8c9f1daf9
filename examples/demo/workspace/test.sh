#!/bin/sh
# The project's test: greet.sh must greet by name.
out=$(sh greet.sh Keel)
if [ "$out" = "Hello, Keel!" ]; then
  echo "ok: $out"
else
  echo "FAIL: expected 'Hello, Keel!', got '$out'"
  exit 1
fi
