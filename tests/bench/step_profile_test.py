"""bench/cuda/step_profile.py on a hand-made ncu CSV: the units converted, the last step found
from its first kernel, kernels grouped by function name, shares summing to the step; a profile
without the first kernel is an error naming it."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = sys.argv.pop(1)
sys.path.insert(0, os.path.dirname(os.path.abspath(SCRIPT)))
import step_profile as sp  # noqa: E402

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')


def row(i, name, unit, value):
    return ('"%d","1","deltaserve","h","%s","1","13","(128, 1, 1)","(48, 4, 64)","0","9.0",'
            '"Command line profiler metrics","gpu__time_duration.sum","%s","%s"'
            % (i, name, unit, value))


KS = [
    ("void gemv_embed_rows_kernel(const void *, int)", "usecond", "3.00"),  # step 1
    ("void gemm_q_kernel<11, 128>(const gemv_matrix *, float *)", "usecond", "100.00"),
    ("void gemv_embed_rows_kernel(const void *, int)", "nsecond", "2,500"),  # step 2: the last
    ("void gemm_q_kernel<11, 128>(const gemv_matrix *, float *)", "msecond", "0.2"),
    ("void gemm_q_kernel<14, 64>(const gemv_matrix *, float *)", "us", "50"),
    ("void (anonymous namespace)::gdn_decode_kernel<4, float>(float *)", "usecond", "37.5"),
    ("argmax_rows(const float *, int)", "usecond", "10"),
]


class StepProfile(unittest.TestCase):
    def lines(self, ks=KS):
        return ["==PROF== Connected to process 1", HEAD] + [
            row(i + 1, n, u, v) for i, (n, u, v) in enumerate(ks)]

    def test_units_and_order(self):
        ks = sp.kernels(self.lines())
        self.assertEqual(len(ks), len(KS))
        self.assertAlmostEqual(ks[2][1], 2.5)
        self.assertAlmostEqual(ks[3][1], 200.0)

    def test_last_step_grouped(self):
        total, rows = sp.table(sp.last_step(sp.kernels(self.lines()), "embed"))
        self.assertAlmostEqual(total, 2.5 + 200 + 50 + 37.5 + 10)
        self.assertEqual([r[0] for r in rows],
                         ["gemm_q_kernel", "gdn_decode_kernel", "argmax_rows", "gemv_embed_rows_kernel"])
        self.assertEqual(rows[0][1], 2)  # both GEMM launches of the last step, not the first's
        self.assertAlmostEqual(rows[0][2], 250.0)
        self.assertAlmostEqual(sum(r[3] for r in rows), 100.0)

    def test_base_name(self):
        self.assertEqual(sp.base_name("void a::b::f<int, (x<3)>(int)"), "f")
        self.assertEqual(sp.base_name("k(float)"), "k")

    def test_cli(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("\n".join(self.lines()) + "\n")
        r = subprocess.run([sys.executable, SCRIPT, f.name, "--markdown"], capture_output=True,
                           text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("| gemm_q_kernel | 2 | 250.0 | 83.3% |", r.stdout)
        self.assertIn("| **step** | 5 | **300.0** | 100% |", r.stdout)
        r = subprocess.run([sys.executable, SCRIPT, f.name, "--first-kernel", "nothing"],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no kernel named like 'nothing'", r.stderr)
        os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
