"""The ack of a tensor-parallel vLLM engine: every worker receives each tensor whole and keeps its shard, so
the merged ack is ok only when all workers read the same bytes and completed the same sync."""

from __future__ import annotations

from rlx.rollout.backends.vllm import merge_worker_acks
from rlx.sync.messages import BucketAck


def ack(**fields) -> BucketAck:
    return BucketAck(**{"sync_id": 7, "bucket_id": 2, "ok": True, "checksums": {"w": 11}, **fields})


def test_agreeing_workers_merge_into_their_ack():
    merged = merge_worker_acks([ack(completed=True), ack(completed=True)])
    assert merged.ok and merged.completed and merged.checksums == {"w": 11} and not merged.in_sync


def test_a_sync_stays_open_and_incomplete_while_one_worker_has_it_open():
    merged = merge_worker_acks([ack(completed=True), ack(in_sync=True)])
    assert merged.ok and merged.in_sync and not merged.completed


def test_workers_that_read_different_bytes_fail_the_ack():
    merged = merge_worker_acks([ack(in_sync=True), ack(checksums={"w": 12}, in_sync=True)])
    assert not merged.ok and "different bytes" in merged.error and merged.in_sync  # the backend then aborts it


def test_one_failed_worker_fails_the_ack_with_its_error():
    merged = merge_worker_acks([ack(completed=True), ack(ok=False, error="worker 1: no such parameter")])
    assert not merged.ok and merged.error == "worker 1: no such parameter" and not merged.completed
