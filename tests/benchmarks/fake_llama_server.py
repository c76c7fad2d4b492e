#!/usr/bin/env python3
"""A stand-in for llama.cpp's llama-server in tests: takes its command line, answers `GET /health` and
`POST /completion` as llama-server does (`tokens_predicted`, `content`, `stop_type`), `--version`, and
records every request body it was sent, one JSON line each, in the file named by FAKE_LLAMA_LOG."""

from __future__ import annotations

import argparse
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/health":
            self._reply(200, {"status": "ok"})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/completion":
            self._reply(404, {"error": "not found"})
            return
        if os.environ.get("FAKE_LLAMA_LOG"):
            with open(os.environ["FAKE_LLAMA_LOG"], "a") as log:
                log.write(json.dumps(body) + "\n")
        if not isinstance(body.get("prompt"), list):
            self._reply(400, {"error": "prompt must be token ids here"})
            return
        n = int(body["n_predict"])
        self._reply(200, {"content": " x" * n, "tokens_predicted": n, "stop_type": "limit", "timings": {}})

    def _reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def main() -> None:
    if "--version" in sys.argv:
        print("version: 0 (fake)")
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
