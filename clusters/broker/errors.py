"""The errors a broker answers a client's request with: each carries the ServerError code the client
sees (CommandError, CommandSendError), and its message."""
from __future__ import annotations

from clusters.protocol import PulsarApi_pb2 as pb


class BrokerServiceError(Exception):
    """A request refused with a ServerError code; `str(e)` is the message sent to the client."""
    code: int = pb.UnknownError

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code


class ServiceUnitNotReady(BrokerServiceError):
    """The topic is not (or no longer) served here; the client redoes the lookup and retries."""
    code = pb.ServiceNotReady


class ProducerBusy(BrokerServiceError):
    code = pb.ProducerBusy


class ConsumerBusy(BrokerServiceError):
    code = pb.ConsumerBusy


class NotAllowed(BrokerServiceError):
    code = pb.NotAllowedError


class ConsumerAssignFailed(BrokerServiceError):
    """No Key_Shared hash range for the consumer (Pulsar's ConsumerAssignException)."""
    code = pb.ConsumerAssignError


class ProducerFenced(BrokerServiceError):
    code = pb.ProducerFenced


class MessageDupUnknown(BrokerServiceError):
    """Deduplication cannot tell yet whether this message is a duplicate (its original is in flight)."""
    code = pb.PersistenceError

    def __init__(self) -> None:
        super().__init__("Cannot determine whether the message is a duplicate at this time")


class TopicFencedForPublish(BrokerServiceError):
    """A write failed; publishing resumes once the adds in flight have completed (Pulsar's fenced topic)."""
    code = pb.PersistenceError

    def __init__(self) -> None:
        super().__init__("Topic is temporarily unavailable: a write failed, retry")


def not_served(topic: str, why: str = "") -> ServiceUnitNotReady:
    extra = f" ({why})" if why else ""
    return ServiceUnitNotReady(f"Topic {topic} not served by this instance{extra}. Please redo the lookup")
