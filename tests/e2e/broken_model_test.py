"""A model whose weights make NaN logits (the tiny reference model with output_norm.weight
overwritten by NaN): the worker fails each request with INTERNAL and a message, greedy and
sampled, stays up and serves the next; `deltaserve generate` exits 1 with one line. Before,
the sampler's assertion took the whole worker down on the first token."""
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402
import numpy as np  # noqa: E402
from gguf import GGUFReader  # noqa: E402


def nan_model(path):
    """Copies the tiny model to path with output_norm.weight all NaN."""
    shutil.copyfile(h.tiny_model(), path)
    r = GGUFReader(path)
    t = next(t for t in r.tensors if t.name == "output_norm.weight")
    assert t.tensor_type.name == "F32", t.tensor_type
    off, n = int(t.data_offset), int(t.n_elements)
    del r
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(np.full(n, np.nan, dtype=np.float32).tobytes())


class BrokenModel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="ds-broken-")
        cls.model = os.path.join(cls.dir, "nan.gguf")
        nan_model(cls.model)
        cls.w = h.start_worker("nanw", model=cls.model, extra=["--slots", "2", "--threads", "1"])
        cls.c = h.Client(cls.w.addr)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.w.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def fails_internal(self, **kw):
        with self.assertRaises(grpc.RpcError) as cm:
            self.c.worker_generate([1, 2, 3], max_tokens=4, **kw)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INTERNAL, cm.exception.details())
        self.assertIn("no finite logit", cm.exception.details())

    def test_requests_fail_and_the_worker_lives(self):
        for kw in ({}, {"temperature": 0.8, "top_k": 5, "seed": 3}, {"logprobs": 2},
                   {"temperature": 1.0, "top_p": 0.9, "seed": 4}):
            self.fails_internal(**kw)
            self.assertIsNone(self.w.p.poll(), "the worker exited")
        load = self.c.load()  # still answering, every slot free again
        self.assertEqual((load.running, load.waiting), (0, 0))
        self.assertEqual(load.free_slots, load.total_slots)

    def test_generate_exits_1_with_a_line(self):
        rc, out, err = h.run_cli(["generate", "--model", self.model, "--ids", "1,2,3",
                                  "--max-tokens", "4", "--threads", "1"])
        self.assertEqual(rc, 1, err)
        self.assertIn("no finite logit", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
