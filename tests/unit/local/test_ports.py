import socket

from streamrl.local import ports as port_module
from streamrl.local.ports import _ephemeral_low, free_port


def test_ports_come_from_below_the_ephemeral_range_distinct_and_bindable():
    low = _ephemeral_low()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10000 <= p < low for p in ports)
    for p in ports[:5]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free for the process it was promised to


def test_a_port_in_use_is_not_handed_out_and_a_full_range_falls_back(monkeypatch):
    monkeypatch.setattr(port_module, "_handed_out", set())
    monkeypatch.setattr(port_module, "_ephemeral_low", lambda: 10003)  # candidates: 10000..10002
    with socket.socket() as busy:
        try:
            busy.bind(("127.0.0.1", 10000))
        except OSError:
            pass  # in use already: just as good
        ports = [free_port() for _ in range(4)]
    assert 10000 not in ports
    assert len(set(ports)) == 4
    assert ports[-1] >= 10003  # the range is spent: a port from the kernel


def test_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert _ephemeral_low(f) == 40000
    assert _ephemeral_low(tmp_path / "missing") == 32768
