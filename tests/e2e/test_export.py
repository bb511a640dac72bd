"""``txjoin export``: a broker's topics as Kafka Connect S3/file sink files, appended on re-run."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.broker import create_topics
from txjoin.bench import produce
from txjoin.export import export_topics
from txjoin.ingest.spark.files import Catalog, read_lines


def test_export_archives_every_record_in_offset_order_and_appends_on_rerun(
        kafka_broker: str, tmp_path: Path) -> None:
    topics = ["eshop.public.orders", "eshop.transaction"]
    first = [(topics[0], "k", '{"n":1}'), (topics[0], "k", None), (topics[1], None, '{"s":1}'),
             (topics[0], "k", '{"n":2}'), (topics[0], "k", '{"n":3}')]
    bootstrap = kafka_broker  # the session's (tests/conftest.py); eshop.* are this test's
    create_topics(bootstrap, topics)
    produce(bootstrap, first)
    counts = export_topics(bootstrap, topics, tmp_path, records_per_file=2)
    assert counts == {topics[0]: 4, topics[1]: 1}
    produce(bootstrap, [(topics[0], "k", '{"n":4}')])
    assert export_topics(bootstrap, topics, tmp_path, records_per_file=2) == {
        topics[0]: 1, topics[1]: 0}

    segments = Catalog(str(tmp_path), topics).segments(topics[0], 0)
    assert [(Path(s.path).name, s.start, s.count) for s in segments] == [
        ("eshop.public.orders+0+0.json", 0, 2), ("eshop.public.orders+0+2.json", 2, 2),
        ("eshop.public.orders+0+4.json", 4, 1)]
    values = [line for s in segments for line in read_lines(s.path)]
    assert values == ['{"n":1}', "null", '{"n":2}', '{"n":3}', '{"n":4}']


def test_export_from_your_own_broker_takes_the_jobs_topics_and_refuses_a_prefix_with_none(
        kafka_broker: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from txjoin.cli import export
    from txjoin.job import load_job

    job_file = Path(__file__).parents[2] / "jobs" / "orders.py"
    topics = load_job(job_file).all_topics("ownkafka")
    create_topics(kafka_broker, topics[:1])
    produce(kafka_broker, [(topics[0], "k", '{"n":1}'), (topics[0], "k", '{"n":2}')])
    base = ["--bootstrap-servers", kafka_broker, "--job", str(job_file)]

    result = CliRunner().invoke(export, [str(tmp_path / "a"), *base, "--topic-prefix",
                                         "ownkafka"])
    assert result.exit_code == 0, result.output
    assert f"{topics[0]}: 2 records" in result.output
    assert f"{topics[1]}: not on the broker yet (nothing exported)" in result.output
    assert [s.count for s in Catalog(str(tmp_path / "a"), topics).segments(topics[0], 0)] == [2]

    wrong = CliRunner().invoke(export, [str(tmp_path / "b"), *base, "--topic-prefix", "nosuch"])
    assert wrong.exit_code == 2
    assert "none of the topics to export is on the broker" in wrong.output
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())

    alone = CliRunner().invoke(export, [str(tmp_path / "c"), "--bootstrap-servers",
                                        kafka_broker])
    assert alone.exit_code == 2 and "--bootstrap-servers needs --job" in alone.output
