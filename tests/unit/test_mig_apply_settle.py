"""The node-side MIG applier waits for the GPU holders it started again to stay up (gpufleet/node/mig_apply.py)."""

from gpufleet.node import mig_apply


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def run_settle(monkeypatch, active_at, units=("nvidia-dcgm.service", "dcgm-exporter.service"), timeout=60.0):
    clock = Clock()
    monkeypatch.setattr(mig_apply, "is_active", lambda unit: active_at(unit, clock.now))
    down = mig_apply.wait_settled(list(units), steady=3.0, timeout=timeout, clock=clock, sleep=clock.sleep)
    return down, clock.now


def test_an_exporter_that_fails_once_beside_its_host_engine_is_waited_for(monkeypatch):
    # dcgm-exporter up at 0, down (failed, auto-restart) from 0.5 to 2.5, then up for good
    down, took = run_settle(monkeypatch, lambda unit, t: unit != "dcgm-exporter.service" or not 0.5 <= t < 2.5)
    assert down == []
    assert 2.5 + 3.0 <= took < 2.5 + 3.0 + 1.0


def test_units_up_from_the_start_are_settled_after_the_steady_time(monkeypatch):
    down, took = run_settle(monkeypatch, lambda unit, t: True)
    assert down == [] and 3.0 <= took < 4.0


def test_a_unit_that_never_stays_up_is_named_at_the_timeout(monkeypatch):
    down, took = run_settle(monkeypatch, lambda unit, t: unit != "dcgm-exporter.service", timeout=20.0)
    assert down == ["dcgm-exporter.service"]
    assert 20.0 <= took < 21.0


def test_a_flapping_unit_is_never_taken_as_settled(monkeypatch):
    # up 1 s, down 1 s: never 3 s in a row
    down, took = run_settle(monkeypatch, lambda unit, t: unit != "dcgm-exporter.service" or int(t) % 2 == 0,
                            timeout=20.5)
    assert took >= 20.5
