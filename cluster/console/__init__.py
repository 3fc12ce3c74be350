"""The operator console: a live web page of one flow's cluster (``twinflow console``, or a
peer's ``--console-listen``).

- :mod:`.snapshot` reads what the page shows from Redis, once per poll;
- :mod:`.failovers` turns the flow's events stream into a timeline of promotions;
- :mod:`.access` decides who may look and who may act, from the peers' tokens;
- :mod:`.app` is the WSGI application (the page, its JSON API, the actions);
- :mod:`.server` serves it, with TLS, beside a peer's ``/metrics`` when a peer serves it.

The page is one HTML file with plain JavaScript and CSS (``static/``): no build step, no
CDN, nothing fetched from the internet at run time.
"""

from . import log_text  # noqa: F401,E402 (installs the escaping of control characters in the console's log)
