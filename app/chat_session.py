"""The reply being written: from the user's message to a saved answer.

ChatSession builds the ChatRequest from a conversation, accumulates the streamed
text whichever chat is on screen, and finishes and saves the reply however it
ends (done, stopped, failed, the engine died, the app closed). It owns no
widget: the window shows what its signals say. A reply is kept here, not only in
the view, so switching chats mid-reply or the worker dying never loses text.
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

from .message_widget import runs_from_mask
from .worker_bridge import WorkerBridge

NOTES = {
    "cancelled": "Stopped.",
    "length": "Stopped at the maximum reply length (Settings → Max reply length).",
    "worker_died": "Interrupted: the engine stopped while writing this reply; the text so far is kept.",
    "closed": "Interrupted: the app was closed while this reply was being written.",
    # On disk while a reply streams: what a restart shows if the app died meanwhile.
    "interrupted": "Interrupted: the app stopped while this reply was being written; the text so far is kept.",
}
# A streaming reply is saved at most this often (in the background): a crash of the
# app loses at most about this much of it.
SAVE_EVERY_MS = 1000
NOT_RUNNING = "The engine is not running; the message was kept, send it again later."


@dataclass
class ActiveReply:
    """The reply being streamed, kept whole whichever chat is on screen."""

    request_id: int
    conv_id: str
    author: str
    message: dict  # the conversation's assistant message being written
    text: str = ""
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
    started = Signal(str)  # conversation id: it gained a user message and an empty reply
    streamed = Signal(str, list)  # conversation id, [(text, from accepted drafts)]
    finished = Signal(str, object)  # conversation id, FinishedReply
    busy_changed = Signal(bool)

    def __init__(
        self, store: ConversationStore, bridge: WorkerBridge, settings: Callable[[], Settings],
        parent: QObject | None = None,
    ):
        super().__init__(parent)
        self.store = store
        self.bridge = bridge
        self.settings = settings  # the window's current settings, read at each request
        self.active: ActiveReply | None = None
        self._save_timer = QTimer(self, singleShot=True, interval=SAVE_EVERY_MS)
        self._save_timer.timeout.connect(self._save_partial)

    # ------------------------------------------------------------ requests

    def send(self, conv_id: str, text: str, model_id: str | None, author: str) -> None:
        """Append the user's message and ask the engine for a reply (one at a time)."""
        if self.active is not None:
            return
        conv = self.store.append_message(conv_id, "user", text)
        system = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        history = system + [
            {"role": m["role"], "content": m["content"]}
            for m in conv.messages
            if m["content"] or m["role"] == "user"  # a failed, empty reply is not context
        ]
        # Saved with the note a restart shows if the app dies before the reply ends.
        extra = {"author": author, "note": NOTES["interrupted"]}
        self.store.append_message(conv_id, "assistant", "", model_id=model_id, extra=extra)
        message = self.store.get(conv_id).messages[-1]
        s = self.settings()
        request = ChatRequest(
            request_id=self.bridge.next_id(),
            messages=history,
            max_new_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            speculative=s.speculative,
        )
        self.active = ActiveReply(request.request_id, conv_id, author, message)
        self.started.emit(conv_id)
        self.busy_changed.emit(True)
        if not self.bridge.send(request):
            self.active.error = NOT_RUNNING
            self.finish("", NOT_RUNNING)

    def stop(self) -> bool:
        """Ask the engine to stop the reply; its TurnDone (cancelled) finishes it."""
        if self.active is None:
            return False
        self.bridge.send(CancelRequest(self.active.request_id))
        return True

    def interrupt(self, reason: str) -> None:
        """Finish the reply now with what has streamed ("closed", "worker_died")."""
        if self.active is not None:
            if reason == "closed":
                self.bridge.send(CancelRequest(self.active.request_id))
            self.finish(self.active.text, NOTES.get(reason))

    def drop(self, conv_id: str) -> None:
        """The conversation is being deleted: stop its reply without saving it."""
        if self.active is not None and self.active.conv_id == conv_id:
            self.bridge.send(CancelRequest(self.active.request_id))
            self.active = None
            self._save_timer.stop()
            self.busy_changed.emit(False)

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
        note = reply.error if event.reason == "error" else NOTES.get(event.reason)
        self.finish(event.text or reply.text, note, stats, event.model_id, event.baseline_tokens_per_s)

    def on_error(self, event: ErrorEvent) -> bool:
        """True when the error is the active reply's (TurnDone follows and shows it)."""
        if self.active is None or event.request_id != self.active.request_id:
            return False
        self.active.error = event.message
        return True

    # ------------------------------------------------------------ finishing

    def finish(
        self, text: str, note: str | None, stats: dict | None = None,
        model_id: str | None = None, baseline: float | None = None,
    ) -> None:
        """Save the reply as it ended and tell the view."""
        reply = self.active
        if reply is None:
            return
        self.active = None
        self._save_timer.stop()
        drafted = (reply.drafted + [False] * len(text))[: len(text)]
        message = reply.message
        message["content"] = text
        message["drafted"] = runs_from_mask(drafted)
        message.pop("note", None)  # "interrupted" held only while it streamed
        for key, value in (("stats", stats), ("model_id", model_id),
                           ("baseline_tokens_per_s", baseline), ("note", note)):
            if value:
                message[key] = dict(value) if key == "stats" else value
        if reply.conv_id in self.store:
            self.store.touch(reply.conv_id)
        self.finished.emit(reply.conv_id, FinishedReply(text, drafted, note, stats, baseline))
        self.busy_changed.emit(False)
