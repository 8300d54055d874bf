"""exitless.sensitivity: the command line's analysis from Python."""

import exitless


def test_the_dominant_entry_of_the_udp_latency_is_ranked_first() -> None:
    a = exitless.sensitivity(
        "validation/did/fig4.toml",
        entries=["exit.external_interrupt_us", "guest.rx_per_packet_ns", "vcanal.enqueue_ns", "kvm.*"],
        scheme="kvm",
        overrides={"duration_s": 0.02},
        jobs=2,
    )
    lat = next(o for o in a["outputs"] if o["output"] == "udp.latency_mean_us")
    assert lat["ranked"][0]["entry"] == "guest.rx_per_packet_ns"
    assert "vcanal.enqueue_ns" in a["unmoved"]
    assert any(s["entry"] == "kvm.halt_poll_us" for s in a["skipped"])
    # The same analysis on one thread.
    b = exitless.sensitivity(
        "validation/did/fig4.toml",
        entries=["exit.external_interrupt_us", "guest.rx_per_packet_ns", "vcanal.enqueue_ns", "kvm.*"],
        scheme="kvm",
        overrides={"duration_s": 0.02},
        jobs=1,
    )
    assert a == b
