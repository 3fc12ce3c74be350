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
    __slots__ = ("flow", "messages")
    FLOW_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    flow: str
    messages: _containers.RepeatedCompositeFieldContainer[Envelope]
    def __init__(self, flow: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ...) -> None: ...

class PublishReply(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, positions: _Optional[_Iterable[str]] = ...) -> None: ...

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
