"""The chat half of the window: the list of conversations, the one on screen,
and the reply the chat session is writing, shown wherever the user looks.

It only shows and routes: the chat session (app/chat_session) writes replies,
the conversation store keeps the text.
"""

from __future__ import annotations

from omnidraft.core.storage.conversations import ConversationStore
from omnidraft.core.storage.search_index import Hit, SearchIndex
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from .banner import Banner
from .chat_header import ChatHeader
from .chat_session import ChatSession, FinishedReply
from .chat_view import ChatView
from .conversation_list import ConversationList
from .target_control import STATUS_MS, TargetControl


class ChatPane(QSplitter):
    status = Signal(str, int)  # status-bar text, ms

    def __init__(
        self, store: ConversationStore, session: ChatSession, targets: TargetControl, banner: Banner,
        parent: QWidget | None = None,
    ):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.store, self.session, self.targets = store, session, targets
        self.current_conv: str | None = None
        self.sidebar = ConversationList()
        self.sidebar.setMinimumWidth(200)
        # Every chat's messages, searchable; in memory only (the chats are encrypted on disk).
        self.search_index = SearchIndex()
        self.search_index.start_building(store.list())
        self.sidebar.searcher = self.search_messages
        self.header = ChatHeader()
        self.chat = ChatView()
        # Attached files' tokens are counted by the engine, with the loaded model's tokenizer.
        tray = self.chat.attachments
        tray.send_request, tray.next_id = session.bridge.send, session.bridge.next_id
        tray.model_name = lambda: targets.name_of(targets.current or targets.wanted)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.setSpacing(0)
        right_layout.addWidget(banner)
        right_layout.addWidget(self.header)
        right_layout.addWidget(self.chat, 1)
        self.setHandleWidth(1)
        self.addWidget(self.sidebar)
        self.addWidget(right)
        self.setStretchFactor(1, 1)
        self.setSizes([250, 700])
        self.setChildrenCollapsible(False)

        self.sidebar.selected.connect(lambda conv_id: self.show_conversation(conv_id, refresh=False))
        self.sidebar.new_requested.connect(self.new_chat)
        self.sidebar.rename_requested.connect(self._rename)
        self.sidebar.delete_requested.connect(self._delete)
        self.sidebar.result_opened.connect(self.open_message)
        self.header.system_prompt_changed.connect(self.set_system_prompt)
        self.chat.send_requested.connect(self.send_message)
        self.chat.stop_requested.connect(self.stop_reply)
        self.chat.edit_requested.connect(lambda index, text: self.with_chat(lambda c: session.edit(c, index, text)))
        self.chat.regenerate_requested.connect(lambda: self.with_chat(session.regenerate))
        self.chat.continue_requested.connect(lambda: self.with_chat(session.continue_reply))
        self.chat.version_requested.connect(self.show_version)
        session.started.connect(self._on_reply_started)
        session.streamed.connect(self._on_reply_streamed)
        session.finished.connect(self._on_reply_finished)
        session.busy_changed.connect(self.chat.set_busy)

    # ------------------------------------------------------------ chatting

    def send_message(self, text: str) -> None:
        if self.session.active is not None:
            return
        if self.current_conv not in self.store:
            self.current_conv = self._new_conversation()
        self.session.send(self.current_conv, text)

    def stop_reply(self) -> None:
        if self.session.stop():
            self.status.emit("Stopping…", STATUS_MS)

    def show_version(self, index: int, position: int) -> None:
        """Show another version of the conversation from message `index` on."""
        if self.session.active is None and self.current_conv in self.store:
            self.store.switch_version(self.current_conv, index, position)
            self.show_conversation(self.current_conv)

    def _on_reply_started(self, conv_id: str) -> None:
        if conv_id == self.current_conv:
            self.show_conversation(conv_id, refresh=False)
        self.refresh_sidebar()

    def _on_reply_streamed(self, conv_id: str, pieces: list) -> None:
        if conv_id == self.current_conv:
            self.chat.stream(pieces)

    def _on_reply_finished(self, conv_id: str, _reply: FinishedReply) -> None:
        if conv_id == self.current_conv:  # the saved reply: its note, figures and buttons
            self.show_conversation(conv_id, refresh=False)
        self.refresh_sidebar()

    # ------------------------------------------------------------ conversations

    def first_conversation(self) -> str | None:
        conversations = self.store.list()
        return conversations[0].id if conversations else None

    def new_chat(self) -> None:
        if self.current_conv in self.store and not self.store.get(self.current_conv).messages:
            self.chat.composer.setFocus()  # already on an empty chat
            return
        self.show_conversation(self._new_conversation())

    def _new_conversation(self, system_prompt: str | None = None) -> str:
        """A new chat, with the default system prompt from Settings unless told otherwise."""
        if system_prompt is None:
            system_prompt = self.session.settings().system_prompt
        return self.store.new(self.targets.current, system_prompt=system_prompt).id

    def set_system_prompt(self, text: str) -> None:
        """The chat on screen answers with this system prompt from its next reply on
        (with no chat on screen, a new one starts with it)."""
        if self.current_conv in self.store:
            self.store.set_system_prompt(self.current_conv, text)
            self.header.set_prompt(self.store.get(self.current_conv).system_prompt)
        else:
            self.show_conversation(self._new_conversation(text))
        self.status.emit("System prompt saved; it applies from the next reply.", STATUS_MS)

    def show_conversation(self, conv_id: str | None, refresh: bool = True) -> None:
        """Put a chat on screen. refresh=False when the sidebar itself asked: rebuilding
        its list inside its own selection signal would delete the item being selected."""
        self.current_conv = conv_id if conv_id in self.store else None
        if self.current_conv is None:
            self.chat.clear()
            self.header.set_prompt(self.session.settings().system_prompt)
        else:
            conv = self.store.get(self.current_conv)
            self.header.set_prompt(conv.system_prompt)
            self.chat.load(conv.messages, self.targets.name_of(conv.model_id or self.targets.wanted))
            active, reply = self.session.active, self.chat.current_reply()
            if active is not None and active.conv_id == conv_id and reply is not None:
                # The live text and tint; its saved "interrupted" note is for a restart only.
                reply.set_text(active.text, active.drafted)
                reply.set_note(None if active.text else "…")
        if refresh:
            self.refresh_sidebar()
        self.chat.composer.setFocus()

    def refresh_sidebar(self) -> None:
        conversations = self.store.list()
        self.search_index.sync(conversations)  # what changed since: a message, an edit, a deletion
        self.sidebar.show_conversations(conversations, self.current_conv)

    def search_messages(self, query: str) -> list[Hit]:
        self.search_index.sync(self.store.list())  # a streaming reply changes without a refresh
        return self.search_index.search(query, self._message_text)

    def _message_text(self, conv_id: str, index: int) -> str:
        return self.store.get(conv_id).messages[index].get("content", "")

    def open_message(self, conv_id: str, index: int) -> None:
        """Show a chat scrolled to one of its messages (a search result)."""
        if conv_id in self.store:
            self.show_conversation(conv_id)
            self.chat.scroll_to_message(index)

    def with_chat(self, action) -> None:
        """Run `action(conversation id)` on the chat on screen, if there is one."""
        if self.current_conv in self.store:
            action(self.current_conv)

    def _rename(self, conv_id: str, title: str) -> None:
        if conv_id in self.store:
            self.store.rename(conv_id, title)
            self.refresh_sidebar()

    def _delete(self, conv_id: str) -> None:
        self.session.drop(conv_id)
        self.store.delete(conv_id)
        if self.current_conv == conv_id:
            self.show_conversation(self.first_conversation())
        self.refresh_sidebar()
