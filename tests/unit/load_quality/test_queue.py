"""How many requests lm-eval keeps queued at the load shaper (load_quality/evaluate.queued)."""

from quantlab.load_quality.evaluate import Load, queued


def test_a_closed_loop_point_keeps_twice_its_concurrency_and_at_least_two():
    assert queued(Load("w/c8", concurrency=8), 64, 300) == 16
    assert queued(Load("c1", concurrency=1), 64, 300) == 2


def test_an_open_loop_queue_waits_at_most_half_the_request_timeout():
    assert queued(Load("w/r2", rate=2.0), 64, 300) == 64  # 64 waiting is 32 s at 2/s
    assert queued(Load("w/r0.1", rate=0.1), 64, 300) == 15  # 15 waiting is 150 s at 0.1/s
    assert queued(Load("w/r0.001", rate=0.001), 64, 300) == 2
