"""The record-keeper fixes: pb 0.9.33 was written for record-keeper 0.9.29, PML 2 needs
>= 0.9.32. Each fix is named after what it fixes and tested in
tests/test_benchmarker_compat.py."""

import datetime
import os

import record_keeper
from powerful_benchmarker import factories as pb_factories
from pytorch_metric_learning.utils import logging_presets

from ..errors import atomic_write, file_fault
from .files import check_database


class LegacyRecordKeeper(record_keeper.RecordKeeper):
    """record-keeper as pb 0.9.33 uses it (written for 0.9.29). Fixes:

    - group_name_keyword_renamed: 0.9.31 renamed ``update_records(input_group_name_for_non_objects=)``
      to ``parent_name=`` (pb uses the old name for its meta records).
    - timestamps_dropped: 0.9.31 silently drops datetime values (pb's ``timestamp``
      column); they are stored as ISO text.
    - record_names_hashed: 0.9.31 replaces record group names whose middle part is longer
      than 64 characters by a hash, but pb reads its aggregator and ensemble tables back
      by their full names (e.g. with ``pca`` in the tester's name): names are kept.
    """

    def update_records(self, record_these, global_iteration, input_group_name_for_non_objects=None, **kwargs):
        if input_group_name_for_non_objects is not None:
            kwargs["parent_name"] = input_group_name_for_non_objects
        record_these = {
            k: v.isoformat(sep=" ") if isinstance(v, datetime.datetime) else v
            for k, v in record_these.items()
        }
        super().update_records(record_these, global_iteration, **kwargs)

    def append_primitive(self, group, series, value, global_iteration):
        if group == "":
            raise ValueError("group cannot be an empty string")
        self.append_data(group, series, value, global_iteration)


def get_legacy_record_keeper(save_figures=None, **kwargs):
    """``logging_presets.get_record_keeper`` without pb's ``save_figures`` argument (removed
    in PML 2 / record-keeper 0.9.31; it only drew list records as figures), returning a
    LegacyRecordKeeper, with its CSV files cut back to what its database holds
    (``drop_csv_rows_of_interrupted_saves``). Its databases are checked first: one that
    cannot be read is a FileFault naming it."""
    if kwargs.get("csv_folder"):
        check_database(os.path.join(kwargs["csv_folder"], "logs.db"))
    if kwargs.get("global_db_path"):
        check_database(kwargs["global_db_path"])
    try:
        keeper, _, _ = logging_presets.get_record_keeper(**kwargs)
    except OSError as e:
        raise file_fault(e, e.filename or kwargs.get("csv_folder"), "creating the records in") from e
    drop_csv_rows_of_interrupted_saves(keeper.record_writer)
    return LegacyRecordKeeper(
        keeper.tensorboard_writer, keeper.record_writer, keeper.attributes_to_search_for
    )


def drop_csv_rows_of_interrupted_saves(record_writer):
    """Fixes csv_rows_of_interrupted_saves: record-keeper appends each record to its CSV
    file and then to its SQLite database, the copy pb reads back when it resumes. A run
    killed between the two leaves CSV rows the database lacks; the resumed run computes
    those records again and appends them a second time. The database is the record of
    what was completed, so each CSV file is cut back to as many data rows as its table
    has (both are append-only, in the same order), before anything new is written."""
    folder = record_writer.folder
    if not os.path.isdir(folder):
        return
    for file_name in sorted(os.listdir(folder)):
        table, extension = os.path.splitext(file_name)
        if extension != ".csv":
            continue
        path = os.path.join(folder, file_name)
        completed = 0
        if record_writer.table_exists(table):
            completed = record_writer.query(f"SELECT COUNT(*) AS n FROM '{table}'")[0]["n"]
        try:
            with open(path) as f:
                lines = f.read().splitlines(keepends=True)
        except OSError as e:
            raise file_fault(e, path, "reading the records") from e
        kept, data_rows = [], 0
        for line in lines:
            if data_rows == completed:
                break
            kept.append(line)
            data_rows += not line.startswith("~iteration~")
        if len(kept) == len(lines):
            continue
        if data_rows == 0:
            os.remove(path)
        else:  # written whole: a run killed here keeps the longer file, cut back next time
            with atomic_write(path, doing="cutting back the records") as f:
                f.writelines(kept)


def drop_records_after(record_keeper, epoch):
    """Fixes records_ahead_of_checkpoints: PML saves an epoch's records, then its
    checkpoints; a run killed in between resumes from the checkpoint before and records
    that epoch a second time. A run that resumes from ``epoch`` first removes the rows of
    later epochs (in the tables with an ``epoch`` column, where they are the last rows)
    from its database, and cuts its CSV files back to match."""
    record_writer = record_keeper.record_writer
    database = record_writer.local_db
    tables = [row["name"] for row in database.query("SELECT name FROM sqlite_master WHERE type='table'")]
    for table in tables:
        columns = [row["name"] for row in database.query(f"PRAGMA table_info('{table}')")]
        if "epoch" in columns:
            database.execute(
                f"DELETE FROM '{table}' WHERE typeof(epoch) IN ('integer', 'real') AND epoch > ?", (epoch,)
            )
    drop_csv_rows_of_interrupted_saves(record_writer)


class RecordKeeperFactory(pb_factories.RecordKeeperFactory):
    """Fixes: get_record_keeper(save_figures=...) no longer exists; old update_records keyword."""

    def _create_general(self, record_keeper_type):
        return get_legacy_record_keeper(**record_keeper_type)
