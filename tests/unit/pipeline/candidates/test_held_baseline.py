"""A baseline server held across a search's rounds (candidates/servers.HeldBaseline)."""

from types import SimpleNamespace

from quantlab.pipeline.candidates.servers import HeldBaseline


class Proc:
    def __init__(self, code=None):
        self.code = code

    def poll(self):
        return self.code


def test_reused_only_alive_bound_wide_enough_and_serving_the_same():
    stopped = []
    server = SimpleNamespace(proc=Proc(), stop=lambda: stopped.append(1))
    held = HeldBaseline(server=server, slots=3, launched="k")
    assert held.usable(3, "k") and held.usable(2, "k")
    assert not held.usable(4, "k")  # a round of more engines than it was bound beside
    assert not held.usable(2, "other")  # a round planning another baseline (engine args, dtype, weights)
    server.proc.code = 1
    assert not held.usable(2, "k")  # it died
    held.stop()
    assert stopped == [1] and held.server is None and not held.usable(2, "k")
    HeldBaseline().stop()  # nothing held: nothing to stop
