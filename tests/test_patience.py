"""Slow or stuck: a guest run that makes progress is not a hang.

The verdicts of vm.Patience on a fake clock (exact: no timing), then the
run loop (vm._run_qemu) with a fake QEMU, a Python process that writes a
console and a harness channel as a guest would: one that keeps making
progress past its ceiling is "slow", one whose heartbeat stops moving is a
"hang". The fake's limits are set so that the other verdict would need the
host to stall the fake for minutes; no test asserts how long anything took.
Also the heartbeat's removal from what the grader parses (guestout), and the
limits scaled to the machine (speed).
"""

import os
import shutil
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

from mmiolab import guestout, ktap, lab, speed, vm
from kitcfg import BUILD

NONCE = "0123456789abcdef0123456789abcdef"
MARK = f"{NONCE} {lab.PROGRESS_LINE}"


def beat(value: int | str) -> bytes:
    return f"{MARK} {value}\n".encode()


class PatienceTest(unittest.TestCase):
    """vm.Patience on a fake clock: stall 30 s, ceiling 100 s, QEMU started at 0."""

    def patience(self, stall=30.0, marker=MARK) -> vm.Patience:
        p = vm.Patience(marker, stall, 100.0, 0.0)
        p.started(5.0)                      # the harness started 5 s in
        return p

    def test_progress_past_the_ceiling_is_slow(self):
        p = self.patience()
        for t in range(6, 101):
            p.feed(beat(t * 16), float(t))
            self.assertIsNone(p.verdict(t + 0.5))
        p.feed(beat(9999), 101.0)
        self.assertEqual(p.verdict(101.0), "slow")
        self.assertEqual(p.beats, 96)

    def test_stuck_just_before_the_ceiling_is_a_hang_not_slow(self):
        # Progress until 95 s, then none: at the ceiling (100 s) that could
        # still be a slow run; only the stall limit, at 125 s, says stuck.
        p = self.patience()
        for t in range(6, 96):
            p.feed(beat(t * 16), float(t))
        for t in range(96, 125):
            p.feed(beat(95 * 16), float(t))     # alive, no further
            self.assertIsNone(p.verdict(t + 0.5))
        self.assertEqual(p.verdict(125.5), "hang")

    def test_a_heartbeat_that_stops_moving_is_stuck(self):
        p = self.patience()
        p.feed(beat(64), 6.0)
        for t in range(7, 37):
            p.feed(beat(64), float(t))      # alive, no further
        self.assertIsNone(p.verdict(36.0))
        self.assertEqual(p.verdict(36.5), "hang")

    def test_no_heartbeat_at_all_once_the_harness_started_is_stuck(self):
        p = self.patience()
        self.assertIsNone(p.verdict(35.0))
        self.assertEqual(p.verdict(35.5), "hang")

    def test_a_boot_is_bounded_by_the_ceiling_alone_and_is_no_slow_run(self):
        p = vm.Patience(MARK, 30.0, 100.0, 0.0)
        self.assertIsNone(p.verdict(99.0))
        self.assertEqual(p.verdict(100.5), "hang")

    def test_a_heartbeat_without_the_nonce_buys_nothing(self):
        p = self.patience()
        for t in range(6, 40):
            p.feed(f"{'f' * 32} {lab.PROGRESS_LINE} {t}\n# mmiolab progress {t}\n".encode(),
                   float(t))
        self.assertEqual(p.verdict(36.0), "hang")
        self.assertEqual(p.beats, 0)

    def test_the_harness_lines_are_progress_and_untagged_data_is_not(self):
        p = self.patience()
        p.feed(f"{NONCE} ok 2 single_cpu\n".encode(), 30.0)
        self.assertIsNone(p.verdict(59.0))
        p.feed(b"H4sIAAAAAAAAA+3d... (a trace being sent)\n", 59.0)
        self.assertEqual(p.verdict(60.5), "hang")

    def test_a_heartbeat_split_across_reads_counts_once(self):
        p = self.patience()
        whole = beat(128)
        p.feed(whole[:10], 6.0)
        p.feed(whole[10:], 7.0)
        self.assertEqual((p.beats, p.value), (1, b"128"))

    def test_without_a_marker_or_stall_limit_the_ceiling_is_a_hang_as_before(self):
        for p in (vm.Patience("", 30.0, 100.0, 0.0), self.patience(stall=0.0)):
            p.started(5.0)
            p.feed(beat(1) + beat(2), 99.0)
            self.assertIsNone(p.verdict(99.5))
            self.assertEqual(p.verdict(100.5), "hang")

    def test_the_words_say_slow_or_stuck_never_crash(self):
        common = ("", "", 250.0, 2.0, "tcg", "console.log")
        slow = vm.RunResult("slow", None, *common, timeout=240.0, stall_timeout=0.0)
        stuck = vm.RunResult("hang", None, *common, timeout=240.0, stall_timeout=120.0)
        self.assertEqual(slow.describe(), "the grading machine was too slow: the guest was "
                         "still making progress when its 240s ran out (not a fault of the "
                         "driver) [tcg, 250.0s]")
        self.assertEqual(stuck.describe(), "the guest made no progress for 120s and was "
                         "killed (hang: stuck, not slow) [tcg, 250.0s]")
        self.assertNotIn("crash", slow.describe())


FAKE_QEMU = textwrap.dedent("""\
    import sys, time
    channel, mode = sys.argv[1], sys.argv[2]
    nonce = %r
    print("mmiolab: running: sh /job/harness.sh", flush=True)
    with open(channel, "w") as ch:
        n = 0
        while True:
            n += 1
            value = n * 64 if mode == "slow" else min(n, 2) * 64
            ch.write(f"{nonce} # mmiolab progress {value}\\n")
            ch.flush()
            time.sleep(0.02)
    """) % NONCE


class ClockTest(unittest.TestCase):
    """A guest's clock against the host's, from the heartbeat's count."""

    def result(self, seconds, boot, beats):
        return vm.RunResult("exited", 0, "", "", seconds, boot, "tcg", "", beats=beats)

    def test_the_beats_per_host_second_of_the_harness(self):
        self.assertEqual(self.result(40.0, 0.0, 20).clock_ratio, 0.5)
        self.assertEqual(self.result(22.0, 2.0, 100).clock_ratio, 5.0)

    def test_too_short_a_run_or_no_boot_says_nothing(self):
        for seconds, boot, beats in ((9.0, 0.0, 50), (60.0, 0.0, 4), (60.0, None, 50)):
            self.assertIsNone(self.result(seconds, boot, beats).clock_ratio)


class FakeGuestTest(unittest.TestCase):
    """vm._run_qemu with a fake QEMU that writes a heartbeat until killed."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="patience-", dir=BUILD)
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.fake = os.path.join(self.tmp, "fake-qemu.py")
        with open(self.fake, "w") as f:
            f.write(FAKE_QEMU)

    def run_fake(self, mode: str, timeout: float, stall: float) -> vm.RunResult:
        def command(cfg, accel, initrd, append, log_dir, channel_path, console_path):
            return [sys.executable, self.fake, channel_path, mode]
        cfg = vm.VMConfig(kernel="-", initrd="-", smp=2, memory="64M", accel="tcg",
                          build=self.tmp, monitor="", timeout=timeout, stall_timeout=stall,
                          progress_marker=MARK, done_marker=f"{NONCE} {lab.END_LINE}")
        with mock.patch.object(vm, "_batch_command", command):
            return vm._run_qemu(cfg, "tcg", "-", [], self.tmp)

    def test_a_guest_progressing_past_its_ceiling_is_slow(self):
        # The ceiling comes at 1 s; a stall needs 120 s without a beat.
        res = self.run_fake("slow", timeout=1.0, stall=120.0)
        self.assertEqual(res.status, "slow", res.describe())
        self.assertGreater(res.beats, 1)
        self.assertIn("too slow", res.describe())

    def test_a_guest_whose_heartbeat_stops_moving_is_a_hang(self):
        # The stall comes at 0.5 s after the last new value; the ceiling at 120 s.
        res = self.run_fake("stuck", timeout=120.0, stall=0.5)
        self.assertEqual(res.status, "hang", res.describe())
        self.assertIn("no progress for 0s", res.describe())


class HeartbeatRemovedTest(unittest.TestCase):
    def test_beats_anywhere_leave_the_rest_as_written(self):
        ktap_lines = [f"{NONCE} KTAP version 1", f"{NONCE} 1..1", f"{NONCE} ok 1 load_unload"]
        trace = "=== mmiolab record 1 begin ===\nQUJDREVG\n=== mmiolab record 1 end ===\n"
        clean = "\n".join(ktap_lines[:2]) + "\n" + trace + ktap_lines[2] + "\n"
        noisy = (beat(0).decode() + "\n".join(ktap_lines[:2]) + "\n" + beat(64).decode()
                 + trace.replace("QUJD", "QUJD" + beat(128).decode()) + ktap_lines[2] + "\n"
                 + beat(192).decode())
        self.assertEqual(guestout.without_heartbeats(noisy, NONCE), clean)
        self.assertEqual(ktap.parse(guestout.without_heartbeats(noisy, NONCE),
                                    nonce=NONCE).root.subtests[0].diagnostics(), [])


class SpeedTest(unittest.TestCase):
    def test_a_share_of_a_cpu_scales_a_guest_of_two_busy_vcpus(self):
        self.assertEqual(speed.share_factor(2, 0.5), 4.0)
        self.assertEqual(speed.share_factor(4, 0.5), 4.0)
        self.assertEqual(speed.share_factor(2, 2.0), 1.0)
        self.assertEqual(speed.share_factor(4, 0.9), 2 / 0.9)

    def test_the_tightest_cgroup_quota_on_the_path_counts(self):
        root = tempfile.mkdtemp(prefix="cgroup-", dir=BUILD)
        self.addCleanup(shutil.rmtree, root, ignore_errors=True)
        for d, text in (("", "max 100000\n"), ("a", "150000 100000\n"),
                        ("a/b", "max 100000\n")):
            os.makedirs(os.path.join(root, "v2", d), exist_ok=True)
            with open(os.path.join(root, "v2", d, "cpu.max"), "w") as f:
                f.write(text)
        os.makedirs(os.path.join(root, "v1", "cpu", "docker", "c1"))
        for d, quota in (("docker", "-1"), ("docker/c1", "50000")):
            for name, val in (("cpu.cfs_quota_us", quota), ("cpu.cfs_period_us", "100000")):
                with open(os.path.join(root, "v1", "cpu", d, name), "w") as f:
                    f.write(val + "\n")
        selfcg = os.path.join(root, "self")
        with open(selfcg, "w") as f:
            f.write("0::/a/b\n")
        self.assertEqual(speed._cgroup_quota(os.path.join(root, "v2"), selfcg), 1.5)
        with open(selfcg, "w") as f:
            f.write("4:cpu,cpuacct:/docker/c1\n3:memory:/docker/c1\n")
        os.rename(os.path.join(root, "v1", "cpu"), os.path.join(root, "v1", "cpu,cpuacct"))
        self.assertEqual(speed._cgroup_quota(os.path.join(root, "v1"), selfcg), 0.5)
        with open(selfcg, "w") as f:
            f.write("0::/\n")
        self.assertIsNone(speed._cgroup_quota(os.path.join(root, "v1"), selfcg))

    def test_the_slowdown_is_at_least_one_and_at_most_the_labs(self):
        with mock.patch.object(speed, "cpu_share", return_value=(0.25, "")):
            self.assertEqual(speed.slowdown(2, 6.0), 6.0)
            self.assertEqual(speed.slowdown(2, 100.0), 8.0)
        with mock.patch.object(speed, "cpu_share", return_value=(4.0, "")):
            self.assertEqual(speed.slowdown(2, 8.0), 1.0)



class CalibrateCommandTest(unittest.TestCase):
    """What an image build prints (the calibration guest faked)."""

    def run_command(self, budget: float, typical: float, work: float,
                    platform: str = "Gradescope") -> tuple[int, str]:
        import argparse
        import contextlib
        import dataclasses
        import io
        from mmiolab import labspec
        from mmiolab.commands import calibrate
        from mmiolab.config import Config
        spec = labspec.load_lab("doorbell")
        spec = dataclasses.replace(spec, limits=dataclasses.replace(spec.limits,
                                                                    cpu_seconds=typical))
        # The guest got 0.25 CPUs: a submission of `typical` CPU seconds takes 4 times that.
        cal = speed.Calibration(work, 3.0, 2, work / speed.REFERENCE_WORK_SECONDS, 0.5, "", 0.25)
        out = io.StringIO()
        args = argparse.Namespace(lab=["doorbell"], budget=budget, platform=platform)
        with mock.patch.object(speed, "calibrate", return_value=cal), \
                mock.patch.object(speed, "cpu_share", return_value=(0.5, "a CPU quota")), \
                mock.patch.object(labspec, "load_lab", return_value=spec), \
                contextlib.redirect_stdout(out):
            status = calibrate.run(args, Config.from_env())
        return status, out.getvalue()

    def test_a_submission_that_fits_and_one_that_does_not(self):
        # Half a CPU: a 2-vCPU guest runs 4 times slower than on 2 CPUs.
        status, text = self.run_command(600, 100, speed.REFERENCE_WORK_SECONDS * 4)
        self.assertEqual(status, 0, text)
        self.assertIn("a doorbell submission should take about 400s here", text)
        self.assertNotIn("WARNING", text)
        status, text = self.run_command(600, 200, speed.REFERENCE_WORK_SECONDS * 4)
        self.assertEqual(status, 1, text)
        self.assertIn("WARNING: Gradescope's limit of 600s cannot fit a doorbell submission "
                      "here (about 800s)", text)

    def test_a_platforms_name_brings_its_time_limit(self):
        """--platform gradescope (the setup template's): the registry's limit,
        with no --budget beside it to drift from it."""
        status, text = self.run_command(0, 200, speed.REFERENCE_WORK_SECONDS * 4, "gradescope")
        self.assertEqual(status, 1, text)
        self.assertIn("WARNING: Gradescope's limit of 600s cannot fit a doorbell submission "
                      "here (about 800s)", text)
        status, text = self.run_command(0, 200, speed.REFERENCE_WORK_SECONDS * 4, "elsewhere")
        self.assertEqual(status, 0, text)
        self.assertNotIn("WARNING", text)
        self.assertNotIn("limit of", text)


if __name__ == "__main__":
    unittest.main()
