#!/usr/bin/env python3
"""The guess-number environment over rlstream's HTTP environment protocol (docs/agents.md),
standard library only.

    python3 env_server.py --port 8765

POST /reset {episode_id, row} starts (or restarts) an episode; POST /step {episode_id, turn,
message} answers a guess with `>` (higher), `<` (lower) or `=`-done (reward 1); a repeated
(episode_id, turn) gets the answer it already got. POST /close {episode_id} forgets it.
GET /healthz answers ok. The same game as env.ts; the row's kwargs.letters = true makes a
guess one letter, A = 1 … P = 16.
"""
import argparse
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EPISODES = {}
LOCK = threading.Lock()


def secret_of(row):
    extra = row.get("extra_info") or {}
    value = extra.get("secret", row.get("ground_truth"))
    secret = int(value)
    if not 1 <= secret <= 16:
        raise ValueError("the row's secret must be in 1..16, got %r" % (value,))
    return secret


def parse_guess(text, letters):
    """The number a message guesses, or None: digits, or with letters one letter A = 1 … P = 16."""
    if letters:
        return ord(text) - 64 if re.fullmatch(r"[A-P]", text) else None
    return int(text) if re.fullmatch(r"[0-9]{1,2}", text) else None


def answer(episode, guess_text):
    episode["guesses"] += 1
    guess = parse_guess(guess_text.strip(), episode["letters"])
    if guess is None or not 1 <= guess <= 16:
        return {"messages": [{"role": "user", "content": "?"}], "reward": 0, "done": False, "metrics": {"invalid": 1}}
    if guess == episode["secret"]:
        return {"messages": [], "reward": 1, "done": True, "metrics": {"solved": 1, "guesses": episode["guesses"]}}
    return {"messages": [{"role": "user", "content": ">" if guess < episode["secret"] else "<"}], "reward": 0, "done": False}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, {"ok": True})
        else:
            self.reply(404, {"error": "unknown path " + self.path})

    def do_POST(self):
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            episode_id = body["episode_id"]
        except (ValueError, KeyError) as e:
            self.reply(400, {"error": "bad request: %s" % e})
            return
        with LOCK:
            if self.path == "/reset":
                try:
                    row = body.get("row") or {}
                    letters = (row.get("kwargs") or {}).get("letters") is True
                    EPISODES[episode_id] = {"secret": secret_of(row), "letters": letters, "guesses": 0, "answers": {}}
                except (TypeError, ValueError) as e:
                    self.reply(400, {"error": str(e)})
                    return
                self.reply(200, {})
            elif self.path == "/step":
                episode = EPISODES.get(episode_id)
                if episode is None:
                    self.reply(404, {"error": "unknown episode " + episode_id})
                    return
                turn = body.get("turn")
                if turn not in episode["answers"]:
                    episode["answers"][turn] = answer(episode, body["message"]["content"])
                self.reply(200, episode["answers"][turn])
            elif self.path == "/close":
                EPISODES.pop(episode_id, None)
                self.reply(200, {})
            else:
                self.reply(404, {"error": "unknown path " + self.path})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print("listening on http://%s:%d" % (args.host, server.server_address[1]), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
