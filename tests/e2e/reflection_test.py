"""Server reflection and health from stock PyPI clients (project venv: grpcio-reflection,
grpcio-health-checking): the router lists its services and serves our file descriptors, so
tools like ghz and grpcurl need no .proto file; each process describes exactly the services it
serves (the router Generation, not Worker; a worker Worker, not Generation); the standard
health checker sees SERVING. Also checks a real worker's reflection."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import harness as h  # noqa: E402

import grpc  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase)


# What both processes serve besides their deltaserve.v1 service.
SERVED = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
          "grpc.reflection.v1.ServerReflection"}


class Reflection(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.w = h.start_fake_worker("reflw", ["--tokens", "5"])
        cls.r = h.start_router([cls.w], name="router_refl")

    @classmethod
    def tearDownClass(cls):
        cls.r.stop()
        cls.w.stop()

    def test_lists_services_and_resolves_descriptors(self):
        with grpc.insecure_channel(self.r.addr) as ch:
            db = ProtoReflectionDescriptorDatabase(ch)
            self.assertEqual(set(db.get_services()), SERVED | {"deltaserve.v1.Generation"})
            pool = descriptor_pool.DescriptorPool(db)
            svc = pool.FindServiceByName("deltaserve.v1.Generation")
            self.assertEqual({m.name for m in svc.methods}, {"Generate", "Abort", "GetModelInfo"})
            # the Worker service is not served here, so not described: not by name, and not in
            # the file the router sends
            with self.assertRaises(KeyError):
                pool.FindServiceByName("deltaserve.v1.Worker")
            self.assertEqual([s.name for s in svc.file.services_by_name.values()], ["Generation"])
            m = svc.FindMethodByName("Generate")
            # streaming flags live in the FileDescriptorProto (protobuf 4.21 has no attribute)
            fdp = descriptor_pb2.FileDescriptorProto()
            svc.file.CopyToProto(fdp)
            gen = [x for s in fdp.service if s.name == "Generation" for x in s.method
                   if x.name == "Generate"][0]
            self.assertTrue(gen.server_streaming)
            self.assertFalse(gen.client_streaming)
            self.assertEqual(m.input_type.full_name, "deltaserve.v1.GenerateRequest")
            self.assertEqual(m.output_type.full_name, "deltaserve.v1.GenerateResponse")
            req = pool.FindMessageTypeByName("deltaserve.v1.GenerateRequest")
            self.assertIn("token_ids", req.fields_by_name)
            self.assertIn("stop", req.fields_by_name)
            f = pool.FindFileByName("deltaserve/v1/deltaserve.proto")
            self.assertEqual(f.package, "deltaserve.v1")
            # a symbol that does not exist is an error, not a hang
            with self.assertRaises(KeyError):
                pool.FindMessageTypeByName("deltaserve.v1.NoSuchMessage")

    def test_worker_reflection(self):
        w = h.start_worker("refl_real_w", extra=["--threads", "1"])
        try:
            with grpc.insecure_channel(w.addr) as ch:
                db = ProtoReflectionDescriptorDatabase(ch)
                self.assertEqual(set(db.get_services()), SERVED | {"deltaserve.v1.Worker"})
                pool = descriptor_pool.DescriptorPool(db)
                svc = pool.FindServiceByName("deltaserve.v1.Worker")
                m = svc.FindMethodByName("GetLoad")
                self.assertEqual(m.output_type.full_name, "deltaserve.v1.Load")
                with self.assertRaises(KeyError):
                    pool.FindServiceByName("deltaserve.v1.Generation")
                self.assertEqual(list(svc.file.services_by_name), ["Worker"])
        finally:
            w.stop()

    def test_standard_health_checker(self):
        with grpc.insecure_channel(self.r.addr) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for svc in ("", "deltaserve.v1.Generation"):
                r = stub.Check(health_pb2.HealthCheckRequest(service=svc), timeout=10)
                self.assertEqual(r.status, health_pb2.HealthCheckResponse.SERVING, svc)
            with self.assertRaises(grpc.RpcError) as e:
                stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
            it = stub.Watch(health_pb2.HealthCheckRequest(service="deltaserve.v1.Generation"),
                            timeout=10)
            self.assertEqual(next(it).status, health_pb2.HealthCheckResponse.SERVING)
            it.cancel()


if __name__ == "__main__":
    unittest.main(verbosity=2)
