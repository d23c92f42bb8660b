"""A camera and two consumers over a channel, each its own process; one consumer is killed
with SIGKILL and replaced, and the replacement resumes where the dead one stopped.

The camera publishes frames into a ring of zero-copy slots (``hl.Channel``).  The
detector (policy "block": the camera waits for it, it gets every frame) and the display
(policy "skip": the camera never waits for it, it skips to the newest frame when behind)
find the channel by name.  When the detector dies, the camera keeps its slots for the
grace period; a new process subscribing under the same name takes over and resumes after
the last frame the dead one acknowledged: no frame lost, at most the one it was holding
seen twice.

Run the parts yourself::

    python examples/camera_channel.py camera              # one shell
    python examples/camera_channel.py detector            # others, any time after
    python examples/camera_channel.py display

or all of it, with the kill and the replacement, as ``make demo`` does::

    python examples/camera_channel.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import hostless as hl

DOMAIN = "hl-example-camch"
SHAPE = (480, 640, 3)  # RGB
FRAMES = 300
FPS = 200


def camera(frames: int) -> None:
    """Publish ``frames`` frames at FPS (each filled with its number mod 251)."""
    dom = hl.Domain.create(DOMAIN, heap="32M", label="camera", unlink_on_close=True, replace_stale=True)
    with dom:
        with hl.Channel(dom, "camera", SHAPE, "u1", depth=8, timeout=10, grace=10) as cam:
            print("camera: channel 'camera' created", flush=True)
            time.sleep(0.3)  # let the consumers started with us subscribe
            for _ in range(frames):
                with cam.loan() as frame:  # waits only for a "block" subscriber 8 frames behind
                    frame.data[...] = frame.seq % 251  # "capture" straight into the slot
                time.sleep(1 / FPS)
            print(f"camera: {cam.published} frames published", flush=True)


def consumer(name: str) -> None:
    """Receive until the camera closes the channel; print the first and last frames."""
    policy = "block" if name == "detector" else "skip"
    with hl.Domain.open(DOMAIN, label=name, wait_for=30) as dom:
        with hl.Subscriber(dom, "camera", name, policy=policy, start="oldest", timeout=30) as sub:
            first = last = None
            seen = 0
            while True:
                try:
                    with sub.receive(timeout=10) as frame:
                        if int(frame.data[0, 0, 0]) != frame.seq % 251:
                            print(f"{name}: frame {frame.seq} holds wrong data", flush=True)
                        first = frame.seq if first is None else first
                        last, seen = frame.seq, seen + 1
                        if seen == 1:
                            how = f" resumed (its predecessor acked {frame.seq - 1})," if sub.resumed else ""
                            print(f"{name}:{how} first frame: {frame.seq}", flush=True)
                except hl.FrameOverwritten:
                    continue  # (skip policy) the frame was overwritten while read: dropped
                except (hl.ChannelClosed, TimeoutError):
                    break
            print(f"{name}: frames {first}..{last}, {seen} received, {sub.lost} skipped", flush=True)


def main() -> int:
    if len(sys.argv) > 1:
        camera(FRAMES) if sys.argv[1] == "camera" else consumer(sys.argv[1])
        return 0
    me = [sys.executable, os.path.abspath(__file__)]
    out = subprocess.PIPE
    det = subprocess.Popen([*me, "detector"], stdout=out, text=True)
    disp = subprocess.Popen([*me, "display"])
    cam = subprocess.Popen([*me, "camera"])
    first_line = det.stdout.readline() if det.stdout else ""  # "detector: first frame: 1"
    print(first_line, end="", flush=True)
    time.sleep(0.5)
    print("demo: kill -9 detector", flush=True)
    det.send_signal(signal.SIGKILL)
    det.wait()
    det2 = subprocess.Popen([*me, "detector"], stdout=out, text=True)
    rc = cam.wait(60)
    lines = det2.communicate(timeout=60)[0].splitlines()
    disp.wait(30)
    for line in lines:
        print(line)
    resumed = [ln for ln in lines if "resumed" in ln]
    ok = (
        rc == 0
        and det2.returncode == 0
        and disp.returncode == 0
        and len(resumed) == 1
        and lines[-1].split()[2].endswith(f"..{FRAMES},")  # the replacement got the last frame ...
        and int(resumed[0].split()[-1]) + int(lines[-1].split()[3]) - 1 == FRAMES  # ... and all since
    )
    print(f"demo: the replacement resumed and received every frame up to {FRAMES}: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
