"""A load against a server that stopped accepting connections stops sending (counted, not sent)."""

from __future__ import annotations

from quantlab.stability.probe import REFUSED_IN_A_ROW, Reply, _GoneServer

REFUSED = Reply(None, error="ConnectError: [Errno 111] Connection refused")


def test_many_refusals_in_a_row_mean_gone_but_a_timeout_or_an_answer_does_not():
    gone = _GoneServer()
    for _ in range(REFUSED_IN_A_ROW - 1):
        gone.saw(REFUSED)
    gone.saw(Reply(200, text="ok"))  # an answer between: the server is busy, not gone
    for _ in range(REFUSED_IN_A_ROW - 1):
        gone.saw(REFUSED)
    gone.saw(Reply(None, error="ReadTimeout: timed out"))
    assert not gone.now
    for _ in range(REFUSED_IN_A_ROW):
        gone.saw(REFUSED)
    assert gone.now
    gone.saw(Reply(200, text="late"))  # once gone, stays gone for the rest of the load
    assert gone.now
