"""A run's record keeper: PML's (``logging_presets.get_record_keeper``), writing the same
files (record-keeper CSVs, ``logs.db``, TensorBoard logs) with less work per epoch.

PML's hooks record every 10 iterations every attribute of the loss, its learnable
parameters included, and write the records to a CSV file and a SQLite database after
every epoch. Two things there cost more than the small runs of the bench themselves:

* a parameter (a loss's proxies, C x D values) is converted to a Python list at every
  record, and then dropped when the records are saved (record-keeper saves no lists
  unless asked); here it is recorded as a placeholder list, dropped the same way;
* every SQLite commit waits for the disk (tens of milliseconds on a virtual disk, some
  25 commits per epoch); here the database is written without those waits
  (``PRAGMA synchronous=OFF``, the same file), and ``sync`` puts it on the disk once, before
  the run's result.json says that the run finished.
"""

import os

from pytorch_metric_learning.utils import common_functions as c_f
from record_keeper import RecordKeeper, RecordWriter
from record_keeper.db_utils import DBManager
from record_keeper.utils import is_list_and_has_more_than_one_element
from torch.utils.tensorboard import SummaryWriter

# what a series of many values is recorded as: a list, which save_records drops
DROPPED = [None, None]


class RunDatabase(DBManager):
    """record-keeper's SQLite database, committed without waiting for the disk."""

    def open(self):
        super().open()
        self.conn.execute("PRAGMA synchronous=OFF")


class RunRecordWriter(RecordWriter):
    """record-keeper's writer; a list-like value that it would drop is not converted first."""

    def __init__(self, folder):
        super().__init__(folder=folder, save_lists=False)
        self.local_db = RunDatabase(self.local_db.db_path, is_global=False)

    def append(self, group_name, series_name, input_val, iteration):
        if not isinstance(input_val, str) and is_list_and_has_more_than_one_element(input_val):
            input_val = DROPPED
        super().append(group_name, series_name, input_val, iteration)

    def sync(self):
        """Write the database to the disk (it is committed without waiting for it)."""
        path = self.local_db.db_path
        if os.path.exists(path):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def get_record_keeper(csv_folder, tensorboard_folder):
    """(record keeper, record writer, TensorBoard writer) as PML's
    ``logging_presets.get_record_keeper(csv_folder, tensorboard_folder)`` makes them."""
    record_writer = RunRecordWriter(csv_folder)
    tensorboard_writer = SummaryWriter(log_dir=tensorboard_folder)
    record_keeper = RecordKeeper(
        tensorboard_writer=tensorboard_writer,
        record_writer=record_writer,
        attributes_to_search_for=c_f.list_of_recordable_attributes_list_names(),
    )
    return record_keeper, record_writer, tensorboard_writer
