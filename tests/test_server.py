"""The local OpenAI-compatible server, driven by real clients: the official `openai`
package, and httpx reading the server-sent events line by line.

Two set-ups: `omnidraft serve`'s own code (server.runner.serve) with a real worker
process on a tiny model, for the clients, the load test and cancelling; and the
server inside the app (AppServer) on an in-process worker loop over a tiny engine,
for the request checks, the queue's bounds, the key, sharing the engine with the
app's chat and learning from served turns.
"""

from __future__ import annotations

import io
import itertools
import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from omnidraft.core.worker.process import WorkerLoop
from omnidraft.core.worker.protocol import ChatRequest, TokenBatch, TurnDone
from omnidraft.server.runner import AppServer, ServerError, bind_refusal, serve

from tests.tiny import learning_engine, tiny_engine, tiny_llama, tiny_smol_target

TIMEOUT = 120.0  # two cores shared with other jobs
KEY = "s3cret-key"


def wait_until(check, timeout: float = TIMEOUT, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def sse_events(response: httpx.Response) -> list:
    """The `data:` payloads of a server-sent event stream, parsed by hand."""
    out = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


# ---------------------------------------------------------------------- a real worker


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, smol_tok) -> Path:
    folder = tmp_path_factory.mktemp("models") / "tiny-smol"
    tiny_smol_target(folder, smol_tok)
    return folder


@pytest.fixture(scope="module")
def served(tiny_model):
    """`omnidraft serve` (its function) on a tiny model: a real worker process."""
    started: dict = {}
    stop = threading.Event()
    out = io.StringIO()
    thread = threading.Thread(target=lambda: started.setdefault("rc", serve(
        "127.0.0.1", 0, model=str(tiny_model), out=out, stop=stop,
        ready=lambda url, service: started.update(url=url, service=service))), daemon=True)
    thread.start()
    wait_until(lambda: "url" in started or "rc" in started, 600, "the server's start")
    assert "url" in started, out.getvalue()
    service = started["service"]
    yield started["url"], service.current.model_id, service, out
    stop.set()
    thread.join(30)
    assert started.get("rc") == 0, out.getvalue()


def client(url: str, timeout: float = TIMEOUT) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", timeout=timeout, max_retries=0)


def test_serve_prints_the_address_and_the_model_name(served):
    url, model_id, _, out = served
    assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
    assert f"at {url}" in out.getvalue() and f"Model name: {model_id}" in out.getvalue()
    models = client(url).models.list()
    ids = [m.id for m in models.data]
    assert ids[0] == model_id and "omnidraft" in ids and "gemma-3-270m" in ids


def test_openai_chat_whole_and_streamed_give_the_same_drafted_reply(served):
    url, model_id, _, _ = served
    messages = [{"role": "user", "content": "Write a loop in Python."}]
    whole = client(url).chat.completions.create(model=model_id, messages=messages, max_tokens=16)
    reply = whole.choices[0].message.content
    assert reply and whole.model == model_id and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens <= 16 and whole.usage.prompt_tokens > 5
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    figures = whole.model_extra["omnidraft"]
    assert figures["method"] == "omnidraft" and figures["tokens_per_step"] >= 1.0
    assert 0.0 <= figures["acceptance"] <= 1.0 and figures["queued_s"] >= 0.0

    stream = client(url).chat.completions.create(model="omnidraft", messages=messages, max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply  # greedy: the same reply, whole or streamed
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].model_extra["omnidraft"]["method"] == "omnidraft"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_openai_completions_with_stop_and_seeded_sampling(served):
    url, model_id, _, _ = served
    api = client(url)
    plain = api.completions.create(model=model_id, prompt="def add(a, b):\n", max_tokens=12)
    text = plain.choices[0].text
    assert text and plain.object == "text_completion" and plain.usage.completion_tokens <= 12
    assert plain.model_extra["omnidraft"]["method"] == "omnidraft"
    # A stop text taken from the middle of the reply ends it just before.
    cut = text[len(text) // 2:][:3]
    if cut.strip():
        stopped = api.completions.create(model=model_id, prompt="def add(a, b):\n", max_tokens=12, stop=[cut])
        assert stopped.choices[0].text == text[:text.index(cut)]
        assert stopped.choices[0].finish_reason == "stop"
    sampled = [api.completions.create(model=model_id, prompt="The cat", max_tokens=8, temperature=0.9,
                                      top_p=0.9, seed=7).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]  # the same seed, the same draws


def test_openai_bad_requests_raise_its_own_errors(served):
    url, model_id, _, _ = served
    api = client(url)
    with pytest.raises(openai.BadRequestError) as empty:
        api.chat.completions.create(model=model_id, messages=[])
    assert "'messages' is empty" in empty.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        api.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert "The model 'gpt-4o' does not exist here" in unknown.value.message
    assert unknown.value.body["code"] == "model_not_found"


def test_httpx_reads_the_event_stream_line_by_line(served):
    url, model_id, _, _ = served
    body = {"model": model_id, "prompt": "for i in range(10):\n", "max_tokens": 10, "stream": True}
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=TIMEOUT) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]" and all(isinstance(e, dict) for e in events[:-1])
    assert all(e["object"] == "text_completion" and e["id"] == events[0]["id"] for e in events[:-1])
    assert events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    whole = httpx.post(f"{url}/completions", json={**body, "stream": False}, timeout=TIMEOUT).json()
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == whole["choices"][0]["text"]


@pytest.mark.timeout(1200)  # 65 drafted replies one after another, on two shared cores
def test_sixteen_clients_four_requests_each_lose_and_mix_nothing(served):
    url, model_id, _, _ = served
    prompts = ["def add(a, b):\n    return", "The snowflake fell. The", "SELECT name FROM users WHERE",
               "Ünïcödé ✓ 123"]
    api = client(url, timeout=1000)  # the last of 16 waits for 15 replies before its own

    def ask(prompt: str, stream: bool) -> str:
        # Raw prompts: a random tiny model's chat replies all look alike (the template's end).
        if not stream:
            return api.completions.create(model=model_id, prompt=prompt, max_tokens=6).choices[0].text
        chunks = api.completions.create(model=model_id, prompt=prompt, max_tokens=6, stream=True)
        return "".join(c.choices[0].text for c in chunks if c.choices)

    expected = {p: ask(p, False) for p in prompts}  # one at a time: the reference replies
    assert len(set(expected.values())) == len(prompts), expected  # tokens of one can't pass for another's

    def one_client(number: int) -> list[tuple[str, str]]:
        order = prompts[number % 4:] + prompts[:number % 4]  # all four, each client its own order
        return [(p, ask(p, stream=(number + i) % 2 == 0)) for i, p in enumerate(order)]

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one_client, range(16)))
    answers = [pair for client_results in results for pair in client_results]
    assert len(answers) == 64
    wrong = [(p, text) for p, text in answers if text != expected[p]]
    assert not wrong, wrong[:3]
    # ... and it still answers.
    assert ask(prompts[0], False) == expected[prompts[0]]
    assert httpx.get(f"{url}/models", timeout=TIMEOUT).status_code == 200


def test_a_client_that_goes_away_mid_stream_stops_its_reply(served):
    url, model_id, service, _ = served
    body = {"model": model_id, "messages": [{"role": "user", "content": "Tell a very long story."}],
            "max_tokens": 1400, "stream": True}
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=TIMEOUT) as response:
        for line in response.iter_lines():
            if '"content"' in line and '"content": ""' not in line:
                break  # the first text: go away
    gone = time.monotonic()
    finished = wait_until(lambda: [s for s in service.recent if s.reason == "cancelled"], 60,
                          "the cancelled reply's end")
    assert finished[-1].new_tokens < 1400
    # The engine is free again: the next request is answered at once.
    answer = httpx.post(f"{url}/chat/completions", timeout=TIMEOUT, json={
        "model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).json()
    assert answer["usage"]["completion_tokens"] <= 4
    assert time.monotonic() - gone < 60


# ---------------------------------------------------------------------- the server inside the app


class InProcessWorker:
    """The worker's request loop in a thread over an engine, with a pump that
    offers each event to the server first, as the app's window does; the rest
    are the app's (`app_events`)."""

    def __init__(self, engine, start: bool = True):
        self.requests, self.events = queue.Queue(), queue.Queue()
        self.loop = WorkerLoop(self.requests, self.events, engine)
        self.ids = itertools.count(1)
        self.app_events: list = []
        self.server: AppServer | None = None
        self.served: list[TurnDone] = []
        self.learn = False
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        if start:
            self.thread.start()

    def next_id(self) -> int:
        return next(self.ids)

    def send(self, request) -> bool:
        self.requests.put(request)
        return True

    def app_server(self, **bounds) -> AppServer:
        self.server = AppServer(self.send, self.next_id, lambda: self.learn, self.served.append, **bounds)
        return self.server

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if self.server is None or not self.server.route(event):
                self.app_events.append(event)

    def app_done(self, request_id: int) -> TurnDone:
        return wait_until(lambda: next((e for e in self.app_events if isinstance(e, TurnDone)
                                        and e.request_id == request_id), None), what="the app's reply")

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
        from omnidraft.core.worker.protocol import Shutdown

        self.requests.put(Shutdown(0))
        if self.thread.is_alive():
            self.thread.join(TIMEOUT)
        self._stop.set()
        self.pump.join(5)


@pytest.fixture(scope="module")
def in_app(tmp_path_factory, smol_tok):
    """The server inside the app, with an API key, on the app's (in-process) worker."""
    engine = tiny_engine(tmp_path_factory.mktemp("in-app") / "tiny", tiny_llama(len(smol_tok), seed=3), smol_tok)
    worker = InProcessWorker(engine)
    url = worker.app_server().start("127.0.0.1", 0, KEY)
    worker.server.service.observe(_loaded(engine))
    yield worker, url
    worker.close()


def _loaded(engine):
    from omnidraft.core.worker.protocol import ModelLoaded

    return ModelLoaded(0, engine.target.entry.id, engine.target.entry.name, 0.0, engine.drafter_description,
                       engine.context_window())


def post(url: str, path: str, body, key: str | None = KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, (bytes, str)):
        return httpx.post(f"{url}{path}", content=body, headers=headers, timeout=TIMEOUT, **kwargs)
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=TIMEOUT, **kwargs)


def error_of(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    message = error["message"]
    assert message.endswith((".", ")")) and "Error" not in message and "Traceback" not in message, message
    return error


def hello(model: str = "omnidraft", **more) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **more}


def test_every_bad_request_gets_a_4xx_error_object_that_says_what_to_change(in_app):
    _, url = in_app
    chat = "/chat/completions"
    assert "not valid JSON" in error_of(post(url, chat, b'{"model": "omnidraft", "messages": ['), 400)["message"]
    assert "must be a JSON object" in error_of(post(url, chat, b"[1, 2]"), 400)["message"]
    assert "not UTF-8" in error_of(post(url, chat, b'{"a": "\xff"}'), 400)["message"]
    unknown = error_of(post(url, chat, hello("no-such-model")), 404)
    assert unknown["code"] == "model_not_found" and "omnidraft" in unknown["message"]
    cases = [
        ({**hello(), "messages": []}, "messages", "is empty"),
        ({"model": "omnidraft"}, "messages", "is required"),
        ({**hello(), "messages": "hello"}, "messages", "must be a list"),
        ({**hello(), "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "must be system"),
        ({**hello(), "messages": [{"role": "user", "content": 5}]}, "messages[0].content", "must be a text"),
        ({**hello(), "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content", "only text parts"),
        (hello(temperature="hot"), "temperature", "must be a number"),
        (hello(temperature=3), "temperature", "from 0.0 to 2.0"),
        (hello(top_p=0), "top_p", "above 0.0"),
        (hello(max_tokens=0), "max_tokens", "from 1 to 8192"),
        (hello(max_tokens=2.5), "max_tokens", "must be an integer"),
        (hello(max_tokens=True), "max_tokens", "must be an integer"),
        (hello(stream="yes"), "stream", "true or false"),
        (hello(stop=[1]), "stop", "a text or a list of texts"),
        (hello(seed="x"), "seed", "must be an integer"),
        (hello(n=2), "n", "must be 1"),
        (hello(model=7), "model", "must be a text"),
        (hello(stream_options=[]), "stream_options", "must be an object"),
    ]
    for body, param, words in cases:
        error = error_of(post(url, chat, body), 400)
        assert error["param"] == param and words in error["message"], (body, error)
    text = "/completions"
    for body, param, words in [
        ({"model": "omnidraft", "prompt": ["a", "b"]}, "prompt", "one text"),
        ({"model": "omnidraft", "prompt": 5}, "prompt", "must be a text"),
        ({"model": "omnidraft", "prompt": ""}, "prompt", "is empty"),
        ({"model": "omnidraft", "prompt": "x", "echo": True}, "echo", "not supported"),
    ]:
        error = error_of(post(url, text, body), 400)
        assert error["param"] == param and words in error["message"], (body, error)
    big = error_of(post(url, chat, b"{" + b" " * (9 * 1024 * 1024) + b"}"), 413)
    assert "at most 8,388,608" in big["message"]
    assert "There is no /v1/embeddings here" in error_of(post(url, "/embeddings", {}), 404)["message"]
    assert "GET is not allowed" in error_of(httpx.get(f"{url}{chat}", timeout=TIMEOUT), 405)["message"]
    # None of them reached the engine; a good request still does.
    assert post(url, chat, hello()).status_code == 200


def test_a_key_is_required_when_set_and_another_host_needs_one(in_app):
    worker, url = in_app
    missing = error_of(post(url, "/chat/completions", hello(), key=None), 401)
    assert "needs an API key" in missing["message"] and missing["code"] == "invalid_api_key"
    wrong = error_of(post(url, "/chat/completions", hello(), key="guess"), 401)
    assert "not the one" in wrong["message"]
    assert error_of(httpx.get(f"{url}/models", timeout=TIMEOUT), 401)["type"] == "authentication_error"
    assert httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT).status_code == 200
    refusal = bind_refusal("0.0.0.0", None)
    assert refusal and "needs an API key" in refusal
    assert bind_refusal("0.0.0.0", KEY) is None and bind_refusal("localhost", None) is None
    with pytest.raises(ServerError, match="needs an API key"):
        AppServer(worker.send, worker.next_id, lambda: False).start("0.0.0.0", 0, "")
    out = io.StringIO()
    assert serve("192.168.1.5", 0, None, out=out) == 2  # refused before any worker starts
    assert "needs an API key" in out.getvalue()


def test_context_overflow_is_trimmed_for_chats_and_refused_with_the_limit_for_prompts(in_app):
    _, url = in_app
    long_turns = []
    for i in range(40):
        long_turns += [{"role": "user", "content": f"question {i} " + "word " * 60},
                       {"role": "assistant", "content": f"answer {i} " + "word " * 60}]
    body = {"model": "omnidraft", "messages": [*long_turns, {"role": "user", "content": "and now?"}],
            "max_tokens": 4}
    trimmed = post(url, "/chat/completions", body)
    assert trimmed.status_code == 200, trimmed.text
    assert trimmed.json()["omnidraft"]["omitted_messages"] > 0
    error = error_of(post(url, "/completions", {"model": "omnidraft", "prompt": "word " * 3000}), 400)
    assert "reads at most 1,536" in error["message"] and error["code"] == "context_length_exceeded"
    one = error_of(post(url, "/chat/completions", {**body, "messages": [{"role": "user", "content": "word " * 3000}]}),
                   400)
    assert "reads at most" in one["message"]


def test_the_app_chat_and_served_requests_share_the_engine(in_app):
    worker, url = in_app
    messages = [{"role": "user", "content": "app question"}]
    reference = ChatRequest(worker.next_id(), messages, max_new_tokens=12)
    worker.send(reference)
    expected = worker.app_done(reference.request_id).text
    with ThreadPoolExecutor(4) as pool:
        served = [pool.submit(post, url, "/chat/completions", hello(max_tokens=12, stream=i % 2 == 0))
                  for i in range(4)]
        time.sleep(0.2)
        ours = ChatRequest(worker.next_id(), messages, max_new_tokens=12)
        worker.send(ours)  # the app's own chat, in the middle of the served ones
        replies = [f.result() for f in served]
    assert worker.app_done(ours.request_id).text == expected
    assert all(r.status_code == 200 for r in replies)
    server_ids = {e.request_id for e in worker.served}
    leaked = [e for e in worker.app_events if isinstance(e, (TokenBatch, TurnDone)) and e.request_id in server_ids]
    assert not leaked and len(server_ids) >= 4


def test_the_wait_for_the_engine_is_bounded_and_said(tmp_path, smol_tok):
    """An engine busy with another reply (its loop not yet reading): one request
    waits, the next is over the queue's bound (429), the waiting one over its
    time (503); once the engine reads, the first is answered."""
    engine = tiny_engine(tmp_path / "tiny", tiny_llama(len(smol_tok), seed=3), smol_tok)
    worker = InProcessWorker(engine, start=False)
    try:
        url = worker.app_server(max_waiting=1, max_wait_s=1.5).start("127.0.0.1", 0, None)
        worker.server.service.observe(_loaded(engine))
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(post, url, "/chat/completions", hello(), None)
            wait_until(lambda: worker.requests.qsize() == 1, 10, "the first request's turn")
            second = pool.submit(post, url, "/chat/completions", hello(), None)
            time.sleep(0.3)
            third = post(url, "/chat/completions", hello(), None)
            full = error_of(third, 429)
            assert "1 requests are already waiting" in full["message"] and third.headers["retry-after"]
            late = error_of(second.result(), 503)
            assert "busy for 2 s" in late["message"] and "was not started" in late["message"]
            worker.thread.start()
            assert first.result().status_code == 200
            assert first.result().json()["omnidraft"]["queued_s"] < 1
        assert post(url, "/chat/completions", hello(), None).status_code == 200
    finally:
        worker.close()


def test_served_turns_teach_the_drafter_only_when_learning_from_api_is_on(tmp_path, smol_tok):
    folder = tmp_path / "tiny"
    tiny_llama(len(smol_tok), seed=3).save_pretrained(folder)
    smol_tok.save_pretrained(folder)
    engine = learning_engine(folder)
    worker = InProcessWorker(engine)
    try:
        url = worker.app_server().start("127.0.0.1", 0, None)
        worker.server.service.observe(_loaded(engine))
        body = {"model": "omnidraft", "prompt": "The cat sat on the", "max_tokens": 12}
        before = len(engine.buffer)
        assert post(url, "/completions", body, None).status_code == 200
        assert len(engine.buffer) == before  # off by default: nothing kept
        worker.learn = True
        assert post(url, "/completions", body, None).status_code == 200
        assert len(engine.buffer) == before + 1
        assert [bool(t.stats) for t in worker.served] == [True, True]
    finally:
        worker.close()


def test_served_replies_are_marked_in_the_chart_history(tmp_path):
    from omnidraft.app.metrics_history import MetricsHistory
    from omnidraft.core.events import TurnStats

    history = MetricsHistory(tmp_path / "metrics.jsonl")
    stats = TurnStats("omnidraft", new_tokens=10, seconds=1.0, steps=4, proposed=8, accepted=6)
    history.add_turn(stats, "m", None)
    history.add_turn(stats, "m", None, served=True)
    history.save()
    again = MetricsHistory(tmp_path / "metrics.jsonl")
    again.load()
    assert [r.served for r in again.replies] == [False, True] and again.load_warning is None
    # A history written before served replies were marked still reads, as chat replies.
    old = tmp_path / "old.jsonl"
    record = {k: v for k, v in json.loads(history._reply_lines[0])["reply"].items() if k != "served"}
    old.write_text(json.dumps({"reply": record}) + "\n")
    legacy = MetricsHistory(old)
    legacy.load()
    assert legacy.load_warning is None and [r.served for r in legacy.replies] == [False]


def test_settings_offer_the_local_server_off_by_default_with_its_status(qtbot):
    from omnidraft.app.settings_dialog import SettingsDialog
    from omnidraft.core.storage.settings import Settings

    settings = Settings()
    assert (settings.server_enabled, settings.server_host, settings.learn_from_api) == (False, "127.0.0.1", False)
    dialog = SettingsDialog(settings, "/somewhere", server_status="Serving at http://127.0.0.1:8090/v1")
    qtbot.addWidget(dialog)
    assert dialog.changes() == {} and "127.0.0.1:8090" in dialog.server_status.text()
    dialog.server_on.setChecked(True)
    dialog.server_port.setValue(9000)
    dialog.server_key.setText(" k ")
    dialog.learn_from_api.setChecked(True)
    assert dialog.changes() == {"server_enabled": True, "server_port": 9000, "server_api_key": "k",
                                "learn_from_api": True}
    assert Settings.from_dict({"server_port": 70000})[0].server_port == 65535
