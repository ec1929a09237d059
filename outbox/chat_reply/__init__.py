"""Chat replies: the built-in ``CHAT_REPLY`` kind (Slack's Web API shape), read-back.

``enqueue_chat_reply`` records a message in the caller's transaction; ``ChatReplyAdapter``
posts it with a marker in its metadata and, after an ambiguous failure, finds the earlier
message by that marker instead of posting twice.
"""

from outbox.chat_reply.adapter import ChatReplyAdapter, marker_of
from outbox.chat_reply.enqueue import chat_reply_request, enqueue_chat_reply
from outbox.chat_reply.settings import ChatReplySettings
from outbox.kinds import CHAT_REPLY

__all__ = [
    "CHAT_REPLY",
    "ChatReplyAdapter",
    "ChatReplySettings",
    "chat_reply_request",
    "enqueue_chat_reply",
    "marker_of",
]
