#!/usr/bin/python3
"""Submits examples/mlp-synthetic.yaml with an override, follows it to the
end, prints its metrics and fetches the trained model: the Python client's
tour (docs/python-client.md).

    TRAINCTL_PYTHON_STUBS=DIR /usr/bin/python3 examples/python-client/submit_watch_fetch.py --epochs 2

The coordinator, token and CA are found as the trainctl CLI finds them
(--coordinator/--token-file/--ca here, else $TRAINCTL_COORDINATOR, $TRAINCTL_TOKEN,
$TRAINCTL_CA, else ~/.config/trainctl/config.yaml). Exits 0 only when the
job SUCCEEDED.
"""
import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if importlib.util.find_spec("trainctl") is None:  # not installed: run from the checkout
    sys.path.insert(0, os.path.join(REPO, "python"))

from trainctl.client import Client, JobState, TrainctlError  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", help="HOST:PORT")
    parser.add_argument("--token-file", help="file whose first line is the token (a token on a command line "
                        "is readable by every user of the host)")
    parser.add_argument("--ca", help="cluster CA certificate (PEM): use TLS")
    parser.add_argument("--epochs", type=int, default=2, help="training.epochs (the file says 3)")
    parser.add_argument("-O", "--out-file", help="where to write the model (default: JOB-model.pt)")
    parser.add_argument("--force", action="store_true", help="replace --out-file when it exists")
    args = parser.parse_args()
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.readline().strip()

    try:
        with Client(args.coordinator, token=token, ca=args.ca) as client:
            job = client.submit(os.path.join(REPO, "examples", "mlp-synthetic.yaml"),
                                **{"training.epochs": args.epochs})
            print("submitted job %s (%s)" % (job.id, job.state))

            for update in client.watch(job):
                if update.HasField("event"):
                    e = update.event
                    print("  [%d] %-12s %s" % (e.seq, e.type, e.message))
            job = client.wait(job)  # the watch ended with the job: returns at once
            print("job %s: %s %s" % (job.id, job.state, job.state_reason))
            if job.state is not JobState.SUCCEEDED:
                return 1

            print("%-7s %-5s %-6s %-6s %-10s %s" % ("ATTEMPT", "RANK", "EPOCH", "STEP", "LOSS", "SAMPLES/S"))
            for batch in client.metrics(job, rank=0):
                for p in batch.points:
                    print("%-7d %-5d %-6d %-6d %-10.5g %.1f" % (
                        batch.attempt, p.rank, p.epoch + 1, p.step, p.loss, p.samples_per_sec))

            model = client.fetch(job, path=args.out_file, force=args.force)
            print("wrote %s (%d bytes, %s) from %s on %s" % (
                model.path, model.size, model.checksum, model.source_path, model.worker_id))
            return 0
    except TrainctlError as e:
        print("submit_watch_fetch: %s" % e, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
