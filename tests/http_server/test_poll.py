"""The server loop's epoll (spark_watchdog/http/poll.py): what it hands back
for each descriptor, and a hang-up seen by the reader and the writer alike."""

from __future__ import annotations

import socket

from spark_watchdog.http.poll import READ, WRITE, Poller


def test_each_ready_descriptor_comes_back_with_its_data_and_events() -> None:
    poller = Poller()
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    try:
        poller.register(a, READ, "a")
        poller.register(c, WRITE, "c")
        assert poller.poll(0) == [("c", WRITE)]  # nothing to read yet; room to write
        b.send(b"x")
        assert sorted(poller.poll(1.0)) == [("a", READ), ("c", WRITE)]
        poller.change(c, WRITE, READ, "c again")
        poller.change(a, READ, 0, "a")
        assert poller.poll(0) == []  # a is no longer watched, c has nothing to read
        d.send(b"y")
        assert poller.poll(1.0) == [("c again", READ)]
        poller.change(a, 0, READ, "a back")
        assert sorted(poller.poll(1.0)) == [("a back", READ), ("c again", READ)]
    finally:
        poller.close()
        for sock in (a, b, c, d):
            sock.close()


def test_a_hang_up_is_seen_as_readable_and_writable() -> None:
    poller = Poller()
    a, b = socket.socketpair()
    try:
        poller.register(a, READ, "a")
        b.close()
        assert poller.poll(1.0) == [("a", READ | WRITE)]
    finally:
        poller.close()
        a.close()
