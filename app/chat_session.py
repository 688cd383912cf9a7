"""The reply being written: from what the user did to a saved answer.

ChatSession turns a user's action in a chat (send, edit and resend, regenerate,
continue) into a ChatRequest, accumulates the streamed text whichever chat is on
screen, and finishes and saves the reply however it ends (done, stopped, failed,
the engine died, the app closed). An edit or a regeneration forks the
conversation (ConversationStore.fork): the old messages stay as another version.
It owns no widget: the window shows what its signals say. A reply is kept here,
not only in the view, so switching chats mid-reply or the worker dying never
loses text; while it streams it is saved every second with an "interrupted"
note, so neither does the app dying.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.storage.settings import Settings
from omnidraft.core.worker.protocol import (
    CancelRequest,
    ChatRequest,
    ErrorEvent,
    TokenBatch,
    TurnDone,
)
from PySide6.QtCore import QObject, QTimer, Signal

from .message_widget import mask_from_runs, runs_from_mask
from .target_control import TargetControl
from .worker_bridge import WorkerBridge

NOTES = {
    "cancelled": "Stopped.",
    "length": "Stopped at the maximum reply length (Settings → Max reply length).",
    "worker_died": "Interrupted: the engine stopped while writing this reply; the text so far is kept.",
    "closed": "Interrupted: the app was closed while this reply was being written.",
    # On disk while a reply streams: what a restart shows if the app died meanwhile.
    "interrupted": "Interrupted: the app stopped while this reply was being written; the text so far is kept.",
}
NOT_RUNNING = "The engine is not running; the message was kept, send it again later."
# A streaming reply is saved at most this often (in the background): a crash of the
# app loses at most about this much of it.
SAVE_EVERY_MS = 1000


def stopped_at_length(message: dict) -> bool:
    """A reply cut short by the token limit (older files only have the note)."""
    return message.get("finish_reason", "length" if message.get("note") == NOTES["length"] else "") == "length"


def reply_actions(messages: list[dict], index: int) -> tuple[bool, bool]:
    """(regenerate, continue) for the message at `index`: the last reply only."""
    last = index == len(messages) - 1 and messages[index]["role"] == "assistant"
    return last, last and bool(messages[index]["content"]) and stopped_at_length(messages[index])


@dataclass
class ActiveReply:
    """The reply being streamed, kept whole whichever chat is on screen."""

    request_id: int
    conv_id: str
    message: dict  # the conversation's assistant message being written
    sent: list[int] = field(default_factory=list)  # indices of the messages sent, in order
    prefix: str = ""  # the text a continued reply had before
    text: str = ""  # the whole reply so far, prefix included
    drafted: list[bool] = field(default_factory=list)  # per character: came from accepted drafts
    error: str | None = None


@dataclass
class FinishedReply:
    """How a reply ended, for the view and the status line."""

    text: str
    drafted: list[bool]
    note: str | None
    stats: dict | None  # the engine's TurnStats in their saved (dict) form
    baseline: float | None  # the target's plain speed, for the speedup


class ChatSession(QObject):
    started = Signal(str)  # conversation id: its messages changed and a reply began
    streamed = Signal(str, list)  # conversation id, [(text, from accepted drafts)]
    finished = Signal(str, object)  # conversation id, FinishedReply
    busy_changed = Signal(bool)

    def __init__(
        self, store: ConversationStore, bridge: WorkerBridge, targets: TargetControl,
        settings: Callable[[], Settings], parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.store, self.bridge, self.targets = store, bridge, targets
        self.settings = settings  # the window's current settings, read at each request
        self.active: ActiveReply | None = None
        # A message sent while the engine starts waits here for its first load to be
        # asked for: the worker serves requests in order, and a chat before any
        # load would find no model.
        self._held: ChatRequest | None = None
        self._save_timer = QTimer(self, singleShot=True, interval=SAVE_EVERY_MS)
        self._save_timer.timeout.connect(self._save_partial)

    # ------------------------------------------------------------ what the user does

    def send(self, conv_id: str, text: str) -> None:
        """Append the user's message and ask for a reply (one reply at a time)."""
        if self.active is None:
            self.store.append_message(conv_id, "user", text)
            self._reply(conv_id)

    def edit(self, conv_id: str, index: int, text: str) -> None:
        """Send an edited user message in place of message `index`; what followed
        it stays as the other version."""
        if self.active is None and self.store.get(conv_id).messages[index]["role"] == "user":
            self.store.fork(conv_id, index, [{"role": "user", "content": text}])
            self._reply(conv_id)

    def regenerate(self, conv_id: str) -> None:
        """Write the last reply again; the old one stays as the other version."""
        messages = self.store.get(conv_id).messages
        if self.active is None and reply_actions(messages, len(messages) - 1)[0]:
            self.store.fork(conv_id, len(messages) - 1, [self._new_reply()])
            self._request(conv_id, len(messages) - 1)

    def continue_reply(self, conv_id: str) -> None:
        """Go on writing the last reply, stopped at the token limit."""
        messages = self.store.get(conv_id).messages
        if self.active is None and reply_actions(messages, len(messages) - 1)[1]:
            message = messages[-1]
            message["note"] = NOTES["interrupted"]
            self.store.save(conv_id)
            self._request(conv_id, len(messages), continuing=message)

    def stop(self) -> bool:
        """Ask the engine to stop the reply; its TurnDone (cancelled) finishes it."""
        if self.active is None:
            return False
        if self._held is not None:  # never sent: nothing for the engine to stop
            self._held = None
            self.finish(self.active.text, "cancelled")
            return True
        self._cancel()
        return True

    def interrupt(self, reason: str) -> None:
        """Finish the reply now with what has streamed ("closed", "worker_died")."""
        if self.active is not None:
            if reason == "closed":
                self._cancel()
            self._held = None
            self.finish(self.active.text, reason)

    def drop(self, conv_id: str) -> None:
        """The conversation is being deleted: stop its reply without saving it."""
        if self.active is not None and self.active.conv_id == conv_id:
            self._cancel()
            self.active = None
            self._save_timer.stop()
            self.busy_changed.emit(False)

    def _cancel(self) -> None:
        """Stop the active reply's request: the engine's if it was sent, else the held one."""
        if self._held is None:
            self.bridge.send(CancelRequest(self.active.request_id))
        self._held = None

    # ------------------------------------------------------------ requests

    def _new_reply(self) -> dict:
        """An empty reply, saved with the note a restart shows if the app dies before it ends."""
        author = self.targets.name_of(self.targets.current or self.targets.wanted)
        return {"role": "assistant", "content": "", "author": author, "note": NOTES["interrupted"]}

    def _reply(self, conv_id: str) -> None:
        fields = {k: v for k, v in self._new_reply().items() if k not in ("role", "content")}
        conv = self.store.append_message(conv_id, "assistant", "", model_id=self.targets.current, extra=fields)
        self._request(conv_id, len(conv.messages) - 1)

    def _request(self, conv_id: str, upto: int, continuing: dict | None = None) -> None:
        """Ask for the reply to messages[:upto]: the message at `upto` (or, continuing,
        the last one, which the model then goes on writing)."""
        conv = self.store.get(conv_id)
        system = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        # A failed, empty reply is not context.
        sent = [i for i, m in enumerate(conv.messages[:upto]) if m["content"] or m["role"] == "user"]
        history = system + [{"role": conv.messages[i]["role"], "content": conv.messages[i]["content"]} for i in sent]
        s = self.settings()
        request = ChatRequest(
            request_id=self.bridge.next_id(), messages=history, max_new_tokens=s.max_new_tokens,
            temperature=s.temperature, top_p=s.top_p, speculative=s.speculative,
            top_k=s.top_k, min_p=s.min_p, repetition_penalty=s.repetition_penalty,
        )
        message = continuing or conv.messages[upto]
        prefix = message["content"] if continuing else ""
        drafted = mask_from_runs(message.get("drafted", []), len(prefix))
        self.active = ActiveReply(request.request_id, conv_id, message, sent, prefix, prefix, drafted)
        self.started.emit(conv_id)
        self.busy_changed.emit(True)
        if self.targets.ready:
            self._send(request)
        else:
            self._held = request

    def engine_ready(self) -> None:
        """The worker is up and its first load was asked for: a message sent while it
        started goes now, after that load."""
        request, self._held = self._held, None
        if request is not None and self.active is not None:
            self._send(request)

    def _send(self, request: ChatRequest) -> None:
        if not self.bridge.send(request):
            self.active.error = NOT_RUNNING
            self.finish(self.active.prefix, "error")

    # ------------------------------------------------------------ engine events

    def on_tokens(self, event: TokenBatch) -> None:
        reply = self.active
        if reply is None or event.request_id != reply.request_id:
            return  # a late batch of a reply already finished (e.g. after Stop)
        for text, drafted in event.pieces:
            reply.text += text
            reply.drafted.extend([bool(drafted)] * len(text))
        reply.message["content"] = reply.text
        if not self._save_timer.isActive():
            self._save_timer.start()
        self.streamed.emit(reply.conv_id, event.pieces)

    def _save_partial(self) -> None:
        """The text so far, on disk with its "interrupted" note, in case the app dies."""
        reply = self.active
        if reply is not None and reply.conv_id in self.store:
            reply.message["drafted"] = runs_from_mask(reply.drafted)
            self.store.save_in_background(reply.conv_id)

    def on_turn_done(self, event: TurnDone) -> None:
        reply = self.active
        if reply is None or event.request_id != reply.request_id:
            return
        stats = event.stats.as_dict() if event.stats is not None else None
        text = reply.prefix + event.text if event.text else reply.text
        # Where the model began to read (0: from the start): the engine left out the
        # oldest messages that no longer fit its context.
        omitted = event.omitted_messages
        reply.message["context_from"] = reply.sent[omitted] if 0 < omitted < len(reply.sent) else 0
        self.finish(text, event.reason, stats, event.model_id, event.baseline_tokens_per_s)

    def on_error(self, event: ErrorEvent) -> bool:
        """True when the error is the active reply's (TurnDone follows and shows it)."""
        if self.active is None or event.request_id != self.active.request_id:
            return False
        self.active.error = event.message
        return True

    # ------------------------------------------------------------ finishing

    def finish(
        self, text: str, reason: str, stats: dict | None = None,
        model_id: str | None = None, baseline: float | None = None,
    ) -> None:
        """Save the reply as it ended (`reason`: the engine's finish reason, or
        "closed", "worker_died", "cleared") and tell the view."""
        reply = self.active
        if reply is None:
            return
        self.active = None
        self._save_timer.stop()
        note = reply.error if reason == "error" else NOTES.get(reason)
        drafted = (reply.drafted + [False] * len(text))[: len(text)]
        message = reply.message
        message.update(content=text, drafted=runs_from_mask(drafted), finish_reason=reason)
        message.pop("note", None)  # "interrupted" held only while it streamed
        for key, value in (("stats", stats), ("model_id", model_id),
                           ("baseline_tokens_per_s", baseline), ("note", note)):
            if value:
                message[key] = dict(value) if key == "stats" else value
        if reply.conv_id in self.store:
            self.store.touch(reply.conv_id)
        self.finished.emit(reply.conv_id, FinishedReply(text, drafted, note, stats, baseline))
        self.busy_changed.emit(False)
