"""Where test and tool ranks meet: a store the launcher hosts, on a port it already holds.

Choosing a "free" port and handing it to ranks that bind it later is a race: under load another
process (a neighbouring test, another job on the machine) takes the port in between and a rank
fails with "address already in use". Here the launcher creates the c10d ``TCPStore`` server
itself, on port 0, so the operating system picks the port and the launcher holds it from the
first moment; the ranks only connect to it.

The ranks keep torch's ``env://`` semantics (what pretrain_gpt.py uses under torchrun):
:func:`rank_env` gives ``MASTER_ADDR``/``MASTER_PORT`` plus ``TORCHELASTIC_USE_AGENT_STORE=True``,
torchrun's own signal that the store is hosted by the launcher, which makes every rank's
``init_process_group`` (``env://`` or ``tcp://``) a client of it instead of rank 0 binding the
port. The same as under torchrun, whose agent hosts the store and sets these variables.

    with hosted_store() as meeting:   # MASTER_ADDR, MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE
        env = {**os.environ, **meeting, "RANK": "0", "WORLD_SIZE": "2"}
        ...   # start the ranks; the store outlives them (ranks exiting early cannot take it down)
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from typing import Iterator

LOOPBACK = "127.0.0.1"
# The store waits this long for a key a rank asks for (a rank joining late under load).
STORE_TIMEOUT = timedelta(minutes=5)
# torch.distributed.rendezvous reads this: "True" = the launcher hosts the store, ranks connect.
AGENT_STORE_VARIABLE = "TORCHELASTIC_USE_AGENT_STORE"
# Bound with the port number 0, a socket gets a port the OS picks (and holds at once).
ANY_PORT = 0


def start_store():
    """A c10d TCPStore server on loopback, on a port the OS picked and this process holds."""
    from torch.distributed import TCPStore

    return TCPStore(LOOPBACK, ANY_PORT, is_master=True, wait_for_workers=False,
                    timeout=STORE_TIMEOUT)


@contextlib.contextmanager
def hosted_store() -> Iterator[dict[str, str]]:
    """Hosts a store for the duration of a run; yields its :func:`rank_env`."""
    store = start_store()
    try:
        yield rank_env(store)
    finally:
        del store  # the server stops with its last reference, held only here


def rank_env(store) -> dict[str, str]:
    """The environment that makes a rank's ``init_process_group`` join ``store``."""
    return {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(store.port),
            AGENT_STORE_VARIABLE: "True"}

