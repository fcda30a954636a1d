"""Model.worker_part: the part of the data this worker reads (daily and the CLI use it)."""

import pytest

import tnrec as tn
from tnrec.ps import LocalPS
from tnrec.table import SGD

fc = tn.feature_column


class Tiny(tn.Model):
    def __init__(self):
        super().__init__()
        cols = [fc.embedding_column(fc.category_column("user"), 2)]
        self.emb = tn.layers.EmbeddingFeatures(cols, SGD(0.1))

    def forward_dense(self, pooled, dense):
        return pooled["emb"][0].sum(1)


class SecondOfTwo(LocalPS):
    """A local PS that reports rank 1 of 2 workers (worker_part asks only that)."""

    rank, world_size = 1, 2


class FakeReader:
    """A tnrec-like reader: whole when ``world_size`` is 1; ``split`` records its call."""

    def __init__(self, world_size=1):
        self.world_size = world_size

    def split(self, rank, world_size):
        return ("part", rank, world_size)

    def __iter__(self):
        return iter(())


@pytest.fixture
def model():
    m = Tiny()
    m.build_tables()
    return m


@pytest.fixture
def second_of_two():
    m = Tiny()
    m.build_tables(ps_factory=SecondOfTwo)
    return m


def test_in_one_process_all_data_is_this_workers_part(model):
    whole, batches = FakeReader(), []
    assert model.worker_part(whole) is whole
    assert model.worker_part(batches) is batches


def test_with_two_workers_a_whole_reader_is_split_and_anything_else_kept(second_of_two):
    assert second_of_two.worker_part(FakeReader()) == ("part", 1, 2)
    already = FakeReader(world_size=2)
    assert second_of_two.worker_part(already) is already
    batches = []
    assert second_of_two.worker_part(batches) is batches
