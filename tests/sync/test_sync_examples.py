"""examples/train_and_publish.py against the session's weight-update server: every mode, parity after each step."""

from sync_helpers import reset_server

MODES = ["head_only", "lora", "full"]


def test_train_and_publish_example(ws_server, tiny_rm, load_example):
    start = reset_server(ws_server.url, tiny_rm)
    records = load_example("train_and_publish").train_and_publish(ws_server.url, tiny_rm, MODES, steps=2)
    assert [r["mode"] for r in records] == [m for m in MODES for _ in range(2)]
    assert [r["version"] for r in records] == list(range(start + 1, start + 7))
    assert max(r["max_diff"] for r in records) < 1e-4
