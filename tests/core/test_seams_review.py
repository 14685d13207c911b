"""Defects at the seams after issue 11's fixes (see tests/core/seams_cases.py); each test fails while its defect is present."""

from __future__ import annotations

from . import seams_cases as cases
from ..tiers.test_redis import _require_redis


def test_abort_under_s3fifo_2q_adaptive_uncaches_its_pages():
    cases.repro_1()


def test_a_root_handle_from_before_reset_is_not_served_freed_blocks():
    cases.repro_2()


def test_cluster_recall_strands_no_lent_copy_unnoticed():
    cases.repro_3()


def test_cluster_belady_is_refused_or_equals_replay():
    cases.repro_4()


def test_a_failed_cascade_write_strands_no_copy_unnoticed():
    cases.repro_5()


def test_lock_refuses_a_handle_of_another_cache():
    cases.repro_6()


def test_redis_close_deletes_only_its_own_namespace():
    _require_redis()
    cases.repro_7()
