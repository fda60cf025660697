"""The Python client's failover between coordinators (trainctl.client with
an address list), against a real trainctl-coordinator (from
$TRAINCTL_BUILD_DIR, as python/client_test.py starts it) and a STAND-IN for
a standby coordinator: a real gRPC server in this process that implements
the standby contract (common/coordinator_failover.h, as
tests/support/standby_stand_in.h does for the C++ tests; swap in a real
standby once it is on this branch): every method UNAVAILABLE with
"standby coordinator; the active coordinator is at HOST:PORT" and the
trailing metadata trainctl-active-coordinator. Needs no worker and no
trainctl-rank.

    TRAINCTL_BUILD_DIR=build TRAINCTL_PYTHON_STUBS=DIR /usr/bin/python3 python/failover_test.py
"""
import os
import socket
import sys
import tempfile
import threading
import time
import unittest
from concurrent import futures

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import client_test  # noqa: E402  (the Cluster helper; makes the stubs importable)

import grpc  # noqa: E402
from trainctl.client import Client, TrainctlError, parse_coordinator_list  # noqa: E402

ACTIVE_KEY = "trainctl-active-coordinator"


class StandbyStandIn:
    """The standby contract's stand-in: counts calls per method and answers
    each UNAVAILABLE, naming ``active`` (or no one, when it is None)."""

    def __init__(self, active):
        self.active = active
        self.calls = {}
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((self,))
        port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = "127.0.0.1:%d" % port
        self._server.start()

    # grpc.GenericRpcHandler
    def service(self, handler_call_details):
        method = handler_call_details.method

        def refuse(request, context):
            with self._lock:
                self.calls[method] = self.calls.get(method, 0) + 1
            if self.active:
                context.set_trailing_metadata(((ACTIVE_KEY, self.active),))
                context.abort(grpc.StatusCode.UNAVAILABLE,
                              "standby coordinator; the active coordinator is at %s" % self.active)
            context.abort(grpc.StatusCode.UNAVAILABLE, "standby coordinator; no active coordinator is known yet")

        return grpc.unary_unary_rpc_method_handler(refuse)

    def count(self, method):
        with self._lock:
            return self.calls.get(method, 0)

    def stop(self):
        self._server.stop(grace=None)


def _unused_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ParseTest(unittest.TestCase):
    def test_list_and_errors_name_the_entry(self):
        self.assertEqual(parse_coordinator_list(" a:1 ,b.example:7070,[::1]:7"), ["a:1", "b.example:7070", "[::1]:7"])
        for text, says in [("a:1,b", "address: 'b': expected HOST:PORT"), ("a:1,,b:2", "entry 2 of"),
                           ("a:0", "'a:0'"), ("a:1,a:1", "listed twice"), ("", "empty")]:
            with self.assertRaises(TrainctlError) as e:
                parse_coordinator_list(text)
            self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(says, e.exception.message)


class FailoverTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="failover_", dir=client_test.WORK)
        cls.cluster = client_test.Cluster(client_test._build_dir(), cls.dir)
        cls.cluster.start_coordinator()
        cls.spec = {"name": "failover-py", "world_size": 1, "device": "cpu",
                    "model": {"name": "mlp", "input_dim": 5, "hidden": [], "classes": 2},
                    "data": {"train": {"format": "synthetic", "length": 60, "size": 5, "classes": 2},
                             "batch_size": 30},
                    "training": {"epochs": 1}}

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def setUp(self):
        self.standby = StandbyStandIn(self.cluster.address)
        self.addCleanup(self.standby.stop)

    def jobs_on_the_active(self):
        with Client(self.cluster.address, token=self.cluster.admin_token, timeout=20) as c:
            return len(c.list())

    def test_standby_first_leads_to_the_active_and_submits_once(self):
        before = self.jobs_on_the_active()
        with Client("%s,%s" % (self.standby.address, self.cluster.address), token=self.cluster.admin_token,
                    timeout=20) as client:
            job = client.submit(self.spec)
            self.assertEqual(self.standby.count("/trainctl.v1.JobService/SubmitJob"), 1)
            self.assertEqual(client.active_address, self.cluster.address)
            self.assertEqual(client.get(job).id, job.id)
            self.assertEqual(self.standby.count("/trainctl.v1.JobService/GetJob"), 0, "the active one is remembered")
        self.assertEqual(self.jobs_on_the_active(), before + 1, "one call, one job")

    def test_hint_followed_when_the_active_is_not_listed(self):
        with Client(self.standby.address, token=self.cluster.admin_token, timeout=20) as client:
            job = client.submit(self.spec)
            self.assertEqual(client.active_address, self.cluster.address)
            cancelled = client.cancel(job, "test")
            self.assertEqual(cancelled.id, job.id)

    def test_unreachable_address_leads_to_the_next(self):
        dead = "127.0.0.1:%d" % _unused_port()
        with Client("%s,%s" % (dead, self.cluster.address), token=self.cluster.admin_token, timeout=20) as client:
            self.assertTrue(client.list() is not None)
            self.assertEqual(client.active_address, self.cluster.address)
        dead2 = "127.0.0.1:%d" % _unused_port()
        started = time.monotonic()
        with self.assertRaises(TrainctlError) as e:
            Client("%s,%s" % (dead, dead2), timeout=3)
        took = time.monotonic() - started
        self.assertGreaterEqual(took, 2, "refused addresses are tried again until the timeout")
        self.assertLess(took, 10, "and given up then")
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn(dead + ": connection failed", e.exception.message)
        self.assertIn(dead2 + ": connection failed", e.exception.message)

    def test_standby_that_knows_no_active_one_leads_to_the_next(self):
        lost = StandbyStandIn(None)
        self.addCleanup(lost.stop)
        with Client("%s,%s" % (lost.address, self.cluster.address), token=self.cluster.admin_token,
                    timeout=20) as client:
            client.list()
            self.assertEqual(lost.count("/trainctl.v1.JobService/ListJobs"), 1)
            self.assertEqual(client.active_address, self.cluster.address)


if __name__ == "__main__":
    unittest.main()
