"""The lab's client host: publishes the chained flow's messages to the peers over gRPC.

Run on the ``client`` host (``ip netns exec <prefix>client python -m twinflow_dev.lab_client
...``, as :func:`.lab_hosts.publisher_command` builds it): a :class:`twinflow.client.Client` on
both peers' advertised names (``peer-a.lab:7070``, ``peer-b.lab:7070``), over TLS with the
client's certificate (the peers ask for one) and the ingest token, publishes messages
``first`` .. ``first + count - 1`` of :func:`~.messages.order_or_payment` in batches of 50 at
``rate`` per second (:class:`~.producers.PacedProducer`).

Under failure: the client's own retries hold (an unavailable peer: the next address at once;
each batch within 30 s, see :mod:`twinflow.client`). Each batch's message IDs are appended
to the ``--acked`` file once the batch is acknowledged, so a reader knows what was sent even
when this process is killed; a batch that fails for good ends the process with status 1 and
the error on stderr, its IDs not in the file (some may have been written: the flow's ID
cache takes each message once).
"""

from __future__ import annotations

import argparse
import sys

from twinflow.client import Client
from twinflow.grpc_security import GrpcSecurity, TlsFiles

from twinflow.testing.messages import order_or_payment
from twinflow.testing.producers import PacedProducer

BATCH = 50
BATCH_DEADLINE_S = 30.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m twinflow_dev.lab_client", description=__doc__.splitlines()[0])
    p.add_argument("--flow", required=True)
    p.add_argument("--peer", action="append", required=True, metavar="HOST:PORT")
    p.add_argument("--ca", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--token", required=True, metavar="REF", help="the ingest token, file:PATH or env:NAME")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--acked", required=True, help="append each acknowledged message ID here")
    args = p.parse_args(argv)
    security = GrpcSecurity.from_refs(TlsFiles(cert=args.cert, key=args.key, ca=args.ca), {"ingest": args.token})
    with Client(args.peer, args.flow, security) as client, open(args.acked, "a") as acked:
        def send(docs: list[dict]) -> None:
            client.publish(docs, deadline_s=BATCH_DEADLINE_S)
            acked.write("".join(f"{d['id']}\n" for d in docs))
            acked.flush()

        producer = PacedProducer("lab-client", send, lambda i: order_or_payment(args.first + i), args.count,
                                 args.rate, BATCH)
        producer.run()  # in this thread: the process is the producer
    if producer.error is not None:
        print(f"lab client: publishing stopped after {len(producer.ids)} of {args.count}: "
              f"{type(producer.error).__name__}: {producer.error}", file=sys.stderr)
        return 1
    print(f"lab client: {len(producer.ids)} messages published", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
