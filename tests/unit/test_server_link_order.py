"""ServerLink's order across threads (no servers: the fence alone). Work handed to the
communication thread (``defer``) must reach ps-lite before any later call the caller's
thread makes, so such a call waits for it; the deferred work's own calls pass, timed by
that thread's watchdog; and the count comes down however the work ends."""
import contextlib
import threading

from kvhybrid.kvstore.ps.link import ServerLink, _in_order


class Dog:
    """A stand-in for a group's watchdog that records which one timed a wait."""

    def __init__(self, name, seen):
        self.name, self.seen = name, seen

    @contextlib.contextmanager
    def waiting(self, what, **kwargs):
        self.seen.append((self.name, what if isinstance(what, str) else what()))
        yield

    def waiting_behind(self, what, **kwargs):   # (a wait for another thread's work)
        return self.waiting(what, **kwargs)


def bare_link(seen) -> ServerLink:
    link = ServerLink.__new__(ServerLink)   # (no ps-lite connection: the fence's state only)
    link._watchdog = Dog("caller's", seen)
    link._deferred = 0
    link._deferred_done = threading.Condition()
    link._thread = threading.local()
    return link


@_in_order
def talk(link, log, who):
    with link._waiting(f"{who} talks"):
        log.append(who)


def test_a_call_waits_for_the_work_handed_to_another_thread():
    seen, log = [], []
    link = bare_link(seen)
    done = link.defer()
    release, finished = threading.Event(), threading.Event()

    def deferred():   # the communication thread: its own calls pass the fence
        with link.deferred(Dog("thread's", seen)):
            talk(link, log, "deferred")
            release.wait(60)
        done()

    def caller():
        talk(link, log, "caller")
        finished.set()

    worker = threading.Thread(target=deferred)
    worker.start()
    later = threading.Thread(target=caller)
    later.start()
    assert not finished.wait(0.2)   # held by the fence while the deferred work runs
    release.set()
    assert finished.wait(60)
    worker.join(60)
    later.join(60)
    assert log == ["deferred", "caller"]
    # the deferred call was timed by its thread's watchdog, the caller's by the store's
    assert ("thread's", "deferred talks") in seen and ("caller's", "caller talks") in seen
    assert link._deferred == 0


def test_without_deferred_work_a_call_waits_for_nothing():
    seen, log = [], []
    link = bare_link(seen)
    talk(link, log, "caller")
    assert log == ["caller"] and seen == [("caller's", "caller talks")]
