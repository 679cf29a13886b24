#!/usr/bin/env python3
"""The soak driver of scripts/soak.sh: mixed load against a running dspark for a set time.

Workers (--concurrency threads) send, by weight: JSON-schema chat answers (streamed and not,
each answer parsed and checked against the schema's required keys), tool calls, Lark
grammars, plain chat, clients that disconnect mid-stream, and hostile requests (a 300,000-deep
Lark rule, a schema nested 10,000 deep, malformed JSON) that must be refused with a 4xx.
A chaos thread edits the model config (a reload) every --reload-every seconds. At the end it
reads the server's resident memory and KV usage and prints one JSON report: requests sent and
answered, statuses, 5xx, invalid answers, lost requests, latency p50/p99 per kind.
Standard library only."""
import argparse, http.client, json, os, random, re, threading, time

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
          "properties": {"city": {"type": "string", "maxLength": 24}, "population": {"type": "integer", "minimum": 0}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}]
DEEP_LARK = "start: " + "(" * 300000 + '"a"' + ")" * 300000 + "\n"
DEEP_SCHEMA = '{"type":"array","items":' * 10000 + "{}" + "}" * 10000


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Soak:
    def __init__(self, args):
        self.args = args
        self.host, self.port = args.host, args.port
        self.lock = threading.Lock()
        self.sent = 0
        self.answered = 0
        self.statuses = {}
        self.invalid = []
        self.latency = {}
        self.errors = []

    def record(self, kind, status, seconds):
        with self.lock:
            self.answered += 1
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
            self.latency.setdefault(kind, []).append(seconds)

    def post(self, path, body, stream=False, read_chunks=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        conn.request("POST", path, body=data, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        if read_chunks is not None:
            got = 0
            while got < read_chunks:
                line = resp.fp.readline()
                if not line:
                    break
                if line.startswith(b"data: "):
                    got += 1
            conn.close()  # the client leaves mid-stream
            return resp.status, None
        text = resp.read().decode("utf-8", "replace")
        conn.close()
        return resp.status, text

    def chat(self, extra, stream=False):
        body = {"model": self.args.model, "temperature": 0.7, "max_tokens": 48,
                "messages": [{"role": "user", "content": random.choice(
                    ["Describe a city as JSON.", "Name a big city.", "What is the weather in Paris?", "Say hello."])}]}
        body.update(extra)
        if stream:
            body["stream"] = True
        return body

    def one(self, kind):
        t0 = time.time()
        with self.lock:
            self.sent += 1
        try:
            if kind == "schema" or kind == "schema-stream":
                stream = kind == "schema-stream"
                fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
                status, text = self.post("/v1/chat/completions", self.chat({"response_format": fmt, "max_tokens": 64}, stream))
                if status == 200:
                    self.check_schema(text, stream)
            elif kind == "tools":
                status, text = self.post("/v1/chat/completions", self.chat({"tools": TOOLS, "tool_choice": "required", "max_tokens": 64}))
                if status == 200:
                    msg = json.loads(text)["choices"][0]
                    if msg["finish_reason"] == "tool_calls":
                        for call in msg["message"]["tool_calls"]:
                            args = json.loads(call["function"]["arguments"])
                            if "city" not in args:
                                self.invalid.append(("tools", call["function"]["arguments"]))
            elif kind == "grammar":
                status, text = self.post("/v1/chat/completions", self.chat({"structured_outputs": {"grammar": 'start: ("yes" | "no") "!"\n'}}))
                if status == 200:
                    content = json.loads(text)["choices"][0]["message"]["content"]
                    if content not in ("yes!", "no!"):
                        self.invalid.append(("grammar", content))
            elif kind == "plain":
                status, _ = self.post("/v1/chat/completions", self.chat({}, stream=True))
            elif kind == "disconnect":
                status, _ = self.post("/v1/chat/completions", self.chat({"max_tokens": 200}, stream=True), read_chunks=2)
            elif kind == "hostile":
                which = random.choice(["lark", "schema", "json"])
                if which == "lark":
                    body = self.chat({"structured_outputs": {"grammar": DEEP_LARK}})
                elif which == "schema":
                    body = self.chat({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads('{"type":"object"}')}}})
                    body = json.dumps(body).replace('{"type": "object"}', DEEP_SCHEMA)
                else:
                    body = '{"model": "%s", "messages": [' % self.args.model
                status, text = self.post("/v1/chat/completions", body)
                if not 400 <= status < 500:
                    self.invalid.append(("hostile " + which, f"{status} {text[:200] if text else ''}"))
            else:
                raise ValueError(kind)
            self.record(kind, status, time.time() - t0)
        except Exception as e:  # a lost request: no status at all
            with self.lock:
                self.errors.append(f"{kind}: {type(e).__name__}: {e}")

    def check_schema(self, text, stream):
        if stream:
            content, finish = "", None
            events = [l[6:] for l in text.splitlines() if l.startswith("data: ")]
            if not events or events[-1] != "[DONE]":
                self.invalid.append(("schema-stream", "no [DONE]"))
                return
            for e in events[:-1]:
                chunk = json.loads(e)
                if "error" in chunk:
                    self.invalid.append(("schema-stream", e[:200]))
                    return
                for c in chunk["choices"]:
                    content += c["delta"].get("content") or ""
                    finish = c.get("finish_reason") or finish
        else:
            choice = json.loads(text)["choices"][0]
            content, finish = choice["message"]["content"], choice["finish_reason"]
        if finish == "stop":
            try:
                doc = json.loads(content)
                ok = isinstance(doc, dict) and set(doc) == {"city", "population"} and isinstance(doc["population"], int)
                ok = ok and isinstance(doc["city"], str) and len(doc["city"]) <= 24 and doc["population"] >= 0
            except ValueError:
                ok = False
            if not ok:
                self.invalid.append(("schema", content))

    def worker(self, deadline):
        kinds = ["schema"] * 3 + ["schema-stream"] * 2 + ["tools"] * 2 + ["grammar"] * 2 + ["plain"] * 2 + ["disconnect", "hostile"]
        while time.time() < deadline:
            self.one(random.choice(kinds))

    def chaos(self, deadline):
        n = 0
        # No reload in the last two intervals, so that the end is read with one engine.
        while time.time() + 2 * self.args.reload_every < deadline:
            time.sleep(self.args.reload_every)
            n += 1
            text = open(self.args.config).read()
            seqs = 12 if n % 2 else 16
            text = re.sub(r"max_num_seqs: \d+", f"max_num_seqs: {seqs}", text)
            tmp = self.args.config + ".tmp"
            open(tmp, "w").write(text)
            os.replace(tmp, self.args.config)

    def metric(self, name):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(name + "{"))


def pct(values, p):
    values = sorted(values)
    return round(values[min(len(values) - 1, int(p / 100 * len(values)))], 3) if values else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=180, help="seconds of load (two reloads included) before the memory baseline")
    ap.add_argument("--concurrency", type=int, default=48)
    ap.add_argument("--reload-every", type=float, default=60)
    args = ap.parse_args()
    soak = Soak(args)
    start = time.time()
    deadline = start + args.minutes * 60
    threads = [threading.Thread(target=soak.worker, args=(deadline,)) for _ in range(args.concurrency)]
    threads.append(threading.Thread(target=soak.chaos, args=(deadline,)))
    rss_start = rss_kib(args.pid)
    for t in threads:
        t.start()
    time.sleep(min(args.warmup, args.minutes * 30))
    rss_warm = rss_kib(args.pid)
    for t in threads:
        t.join()
    time.sleep(2)
    report = {
        "minutes": args.minutes, "concurrency": args.concurrency,
        "sent": soak.sent, "answered": soak.answered, "lost": len(soak.errors), "lost_examples": soak.errors[:5],
        "statuses": soak.statuses, "server_errors": sum(v for k, v in soak.statuses.items() if k.startswith("5")),
        "invalid_answers": len(soak.invalid), "invalid_examples": soak.invalid[:5],
        "rss_mib": {"start": round(rss_start / 1024, 1), "after_warmup": round(rss_warm / 1024, 1), "end": round(rss_kib(args.pid) / 1024, 1)},
        "kv_cache_usage_end": soak.metric("vllm:kv_cache_usage_perc"),
        "running_end": soak.metric("vllm:num_requests_running"), "waiting_end": soak.metric("vllm:num_requests_waiting"),
        "latency_s": {k: {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99)} for k, v in sorted(soak.latency.items())},
    }
    warm = report["rss_mib"]["after_warmup"]
    report["rss_growth_after_warmup_pct"] = round(100 * (report["rss_mib"]["end"] - warm) / warm, 1) if warm else None
    print(json.dumps(report, indent=2))
    ok = (report["lost"] == 0 and report["server_errors"] == 0 and report["invalid_answers"] == 0
          and report["kv_cache_usage_end"] == 0 and report["running_end"] == 0)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
