from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Envelope(_message.Message):
    __slots__ = ("id", "key", "position", "body", "rule")
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    id: str
    key: str
    position: str
    body: bytes
    rule: str
    def __init__(self, id: _Optional[str] = ..., key: _Optional[str] = ..., position: _Optional[str] = ..., body: _Optional[bytes] = ..., rule: _Optional[str] = ...) -> None: ...

class EscalationBatch(_message.Message):
    __slots__ = ("flow", "from_node", "epoch", "seq", "claims")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    flow: str
    from_node: str
    epoch: int
    seq: int
    claims: _containers.RepeatedCompositeFieldContainer[Envelope]
    def __init__(self, flow: _Optional[str] = ..., from_node: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., claims: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ...) -> None: ...

class EscalationAck(_message.Message):
    __slots__ = ("seq", "accepted", "claimed", "reason")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    seq: int
    accepted: bool
    claimed: int
    reason: str
    def __init__(self, seq: _Optional[int] = ..., accepted: _Optional[bool] = ..., claimed: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("flow", "messages", "publisher")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    flow: str
    messages: _containers.RepeatedCompositeFieldContainer[Envelope]
    publisher: str
    def __init__(self, flow: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ..., publisher: _Optional[str] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, positions: _Optional[_Iterable[str]] = ...) -> None: ...

class Notice(_message.Message):
    __slots__ = ("cursor", "id", "flow", "node", "outlink", "reason", "at", "position", "publisher")
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OUTLINK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    cursor: str
    id: str
    flow: str
    node: str
    outlink: str
    reason: str
    at: float
    position: str
    publisher: str
    def __init__(self, cursor: _Optional[str] = ..., id: _Optional[str] = ..., flow: _Optional[str] = ..., node: _Optional[str] = ..., outlink: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[float] = ..., position: _Optional[str] = ..., publisher: _Optional[str] = ...) -> None: ...

class NoticesRequest(_message.Message):
    __slots__ = ("flow", "publisher", "after", "max")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    PUBLISHER_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    flow: str
    publisher: str
    after: str
    max: int
    def __init__(self, flow: _Optional[str] = ..., publisher: _Optional[str] = ..., after: _Optional[str] = ..., max: _Optional[int] = ...) -> None: ...

class NoticesReply(_message.Message):
    __slots__ = ("notices", "cursor")
    NOTICES_FIELD_NUMBER: _ClassVar[int]
    CURSOR_FIELD_NUMBER: _ClassVar[int]
    notices: _containers.RepeatedCompositeFieldContainer[Notice]
    cursor: str
    def __init__(self, notices: _Optional[_Iterable[_Union[Notice, _Mapping]]] = ..., cursor: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("flow", "node_id", "role", "epoch", "uplink_lag", "baked", "claimed", "rolled_back", "delivered", "failed", "unclaimed", "grpc_address", "backpressure", "redis", "zookeeper", "peer_id", "rule_pending", "nohit")
    class RulePendingEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    FLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UPLINK_LAG_FIELD_NUMBER: _ClassVar[int]
    BAKED_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_FIELD_NUMBER: _ClassVar[int]
    DELIVERED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    UNCLAIMED_FIELD_NUMBER: _ClassVar[int]
    GRPC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    BACKPRESSURE_FIELD_NUMBER: _ClassVar[int]
    REDIS_FIELD_NUMBER: _ClassVar[int]
    ZOOKEEPER_FIELD_NUMBER: _ClassVar[int]
    PEER_ID_FIELD_NUMBER: _ClassVar[int]
    RULE_PENDING_FIELD_NUMBER: _ClassVar[int]
    NOHIT_FIELD_NUMBER: _ClassVar[int]
    flow: str
    node_id: str
    role: str
    epoch: int
    uplink_lag: int
    baked: int
    claimed: int
    rolled_back: int
    delivered: int
    failed: int
    unclaimed: int
    grpc_address: str
    backpressure: int
    redis: str
    zookeeper: str
    peer_id: str
    rule_pending: _containers.ScalarMap[str, int]
    nohit: int
    def __init__(self, flow: _Optional[str] = ..., node_id: _Optional[str] = ..., role: _Optional[str] = ..., epoch: _Optional[int] = ..., uplink_lag: _Optional[int] = ..., baked: _Optional[int] = ..., claimed: _Optional[int] = ..., rolled_back: _Optional[int] = ..., delivered: _Optional[int] = ..., failed: _Optional[int] = ..., unclaimed: _Optional[int] = ..., grpc_address: _Optional[str] = ..., backpressure: _Optional[int] = ..., redis: _Optional[str] = ..., zookeeper: _Optional[str] = ..., peer_id: _Optional[str] = ..., rule_pending: _Optional[_Mapping[str, int]] = ..., nohit: _Optional[int] = ...) -> None: ...

class HandoverRequest(_message.Message):
    __slots__ = ("timeout_s",)
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    timeout_s: float
    def __init__(self, timeout_s: _Optional[float] = ...) -> None: ...

class HandoverReply(_message.Message):
    __slots__ = ("ok", "new_master", "seconds", "reason")
    OK_FIELD_NUMBER: _ClassVar[int]
    NEW_MASTER_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    new_master: str
    seconds: float
    reason: str
    def __init__(self, ok: _Optional[bool] = ..., new_master: _Optional[str] = ..., seconds: _Optional[float] = ..., reason: _Optional[str] = ...) -> None: ...

class FailuresRequest(_message.Message):
    __slots__ = ("flow", "node", "reason", "since", "until", "status", "limit", "after", "audit_id")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    flow: str
    node: str
    reason: str
    since: float
    until: float
    status: str
    limit: int
    after: str
    audit_id: str
    def __init__(self, flow: _Optional[str] = ..., node: _Optional[str] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ..., status: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ..., audit_id: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("audit_id", "status", "flow", "node", "outlink", "reason", "at", "message_id", "message", "position", "peer", "epoch", "resubmit_of", "mark_json", "outcome_json")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OUTLINK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUBMIT_OF_FIELD_NUMBER: _ClassVar[int]
    MARK_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_JSON_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    status: str
    flow: str
    node: str
    outlink: str
    reason: str
    at: float
    message_id: str
    message: bytes
    position: str
    peer: str
    epoch: int
    resubmit_of: str
    mark_json: str
    outcome_json: str
    def __init__(self, audit_id: _Optional[str] = ..., status: _Optional[str] = ..., flow: _Optional[str] = ..., node: _Optional[str] = ..., outlink: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[float] = ..., message_id: _Optional[str] = ..., message: _Optional[bytes] = ..., position: _Optional[str] = ..., peer: _Optional[str] = ..., epoch: _Optional[int] = ..., resubmit_of: _Optional[str] = ..., mark_json: _Optional[str] = ..., outcome_json: _Optional[str] = ...) -> None: ...

class FailuresReply(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ...) -> None: ...

class AuditActionRequest(_message.Message):
    __slots__ = ("flow", "audit_ids", "all_matching", "filter", "by")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    AUDIT_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_MATCHING_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    flow: str
    audit_ids: _containers.RepeatedScalarFieldContainer[str]
    all_matching: bool
    filter: FailuresRequest
    by: str
    def __init__(self, flow: _Optional[str] = ..., audit_ids: _Optional[_Iterable[str]] = ..., all_matching: _Optional[bool] = ..., filter: _Optional[_Union[FailuresRequest, _Mapping]] = ..., by: _Optional[str] = ...) -> None: ...

class AuditActionResult(_message.Message):
    __slots__ = ("audit_id", "ok", "reason", "refusal", "mark_json")
    AUDIT_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    MARK_JSON_FIELD_NUMBER: _ClassVar[int]
    audit_id: str
    ok: bool
    reason: str
    refusal: str
    mark_json: str
    def __init__(self, audit_id: _Optional[str] = ..., ok: _Optional[bool] = ..., reason: _Optional[str] = ..., refusal: _Optional[str] = ..., mark_json: _Optional[str] = ...) -> None: ...

class AuditActionReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AuditActionResult]
    def __init__(self, results: _Optional[_Iterable[_Union[AuditActionResult, _Mapping]]] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("by",)
    BY_FIELD_NUMBER: _ClassVar[int]
    by: str
    def __init__(self, by: _Optional[str] = ...) -> None: ...

class Suspension(_message.Message):
    __slots__ = ("flow", "node", "id", "reason", "since", "until")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    flow: str
    node: str
    id: str
    reason: str
    since: float
    until: float
    def __init__(self, flow: _Optional[str] = ..., node: _Optional[str] = ..., id: _Optional[str] = ..., reason: _Optional[str] = ..., since: _Optional[float] = ..., until: _Optional[float] = ...) -> None: ...

class ResumeReply(_message.Message):
    __slots__ = ("resumed",)
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    resumed: _containers.RepeatedCompositeFieldContainer[Suspension]
    def __init__(self, resumed: _Optional[_Iterable[_Union[Suspension, _Mapping]]] = ...) -> None: ...
