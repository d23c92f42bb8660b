"""Two independently started processes that find each other by name.

A camera process creates the domain ``hl-example-cam``, puts a ring of frame
buffers in its heap and publishes them, with a timeline that counts the
frames, under names.  A detector process, started on its own (another shell,
another service), opens the domain by its name, looks the objects up by
theirs, and follows the timeline: no side channel, no file of handles.
The detector is then killed with SIGKILL and a new one takes over (the name
table still holds the camera's objects; the dead detector held nothing the
camera needs).

Run the two halves yourself::

    python examples/by_name.py camera      # in one shell
    python examples/by_name.py detector    # in another (any time after)

or both, with the kill and the replacement, as ``make demo`` does::

    python examples/by_name.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

import hostless as hl

DOMAIN = "hl-example-cam"
SHAPE = (480, 640)
RING = 8  # frames in flight
FPS = 100


def camera(frames: int) -> None:
    """Produce ``frames`` frames at FPS, publishing them by name."""
    with hl.Domain.create(
        DOMAIN, heap="64M", label="camera", unlink_on_close=True, replace_stale=True
    ) as dom:
        ring = dom.buffer((RING, *SHAPE), "u1")
        counter = dom.timeline()  # value n: frame n is in ring[n % RING]
        dom.publish("camera/frames", ring)
        dom.publish("camera/counter", counter)
        print(f"camera: published 'camera/frames' and 'camera/counter' in {DOMAIN}", flush=True)
        pixels = ring.numpy()
        for n in range(1, frames + 1):
            pixels[n % RING] = n % 251  # "capture"
            counter.signal(n)
            time.sleep(1 / FPS)
        print(f"camera: {frames} frames sent", flush=True)
        time.sleep(0.2)  # let the last detector see the end


def detector(label: str, limit: int) -> None:
    """Follow the camera's frames by name until ``limit`` frames or the camera leaves."""
    dom = hl.Domain.open(DOMAIN, label=label, wait_for=30)  # waits for the camera to create it
    with dom:
        ring = dom.lookup("camera/frames", timeout=10)
        counter = dom.lookup("camera/counter", timeout=10)
        assert isinstance(ring, hl.Buffer) and isinstance(counter, hl.Timeline)
        pixels = ring.numpy()
        seen, n = 0, counter.value
        print(f"{label}: found the camera's objects by name, at frame {n}", flush=True)
        while seen < limit:
            try:
                st = counter.wait(n + 1, timeout=1.0)
            except TimeoutError:
                break  # the camera paused for a second: done
            if st != hl.Status.SUCCESS:  # the camera left (OWNER_DIED) or failed the timeline
                print(f"{label}: the camera's timeline ended with {st.name} at frame {n}", flush=True)
                break
            n = counter.value
            frame = pixels[n % RING]
            if int(frame[0, 0]) != n % 251:
                print(f"{label}: frame {n} overwritten before it was read (too slow)", flush=True)
            seen += 1
            print(
                f"{label}: frame {n} mean {float(np.mean(frame)):.0f}", flush=True
            ) if seen % 50 == 0 else None


def main() -> int:
    if len(sys.argv) > 1:
        if sys.argv[1] == "camera":
            camera(int(sys.argv[2]) if len(sys.argv) > 2 else 600)
        else:
            detector(sys.argv[1] if sys.argv[1] != "detector" else "detector", 10**9)
        return 0
    me = [sys.executable, os.path.abspath(__file__)]
    det = subprocess.Popen([*me, "detector-1"])  # started first: it waits for the domain
    time.sleep(0.3)
    cam = subprocess.Popen([*me, "camera", "300"])
    time.sleep(1.5)
    print("demo: kill -9 detector-1", flush=True)
    det.send_signal(signal.SIGKILL)
    det.wait()
    det2 = subprocess.Popen([*me, "detector-2"])
    rc = cam.wait(60)
    det2.wait(30)
    print(
        f"demo: camera exit {rc}, detector-2 exit {det2.returncode}; "
        f"/dev/shm/{DOMAIN} {'left behind' if os.path.exists('/dev/shm/' + DOMAIN) else 'removed'}"
    )
    return rc or det2.returncode


if __name__ == "__main__":
    sys.exit(main())
