"""tnrec trains the same model as plain PyTorch with fixed tables and row-wise AdaGrad."""

import copy

import numpy as np
import torch
import torch.nn.functional as F

import tnrec as tn
from tnrec.table import AdaGrad, SparseTable, normal

fc = tn.feature_column
DIM = 4
FIELDS = [("user", "sum"), ("item", "sum"), ("tags", "mean")]
SPARSE_LR, DENSE_LR, EPS, G2 = 0.05, 0.01, 1e-8, 0.1


class DenseHead(torch.nn.Module):
    """DeepFM's dense part: linear terms + FM second order + MLP over fields and dense."""

    def __init__(self):
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(3 * DIM + 2, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )
        self.dense_linear = torch.nn.Linear(2, 1)

    def forward(self, fields, linear, dense):  # fields [B, 3, D], linear [B, 3, 1], dense [B, 2]
        s = fields.sum(1)  # [B, D]
        fm = 0.5 * (s * s - (fields * fields).sum(1)).sum(1)  # [B]
        deep = self.mlp(torch.cat([fields.flatten(1), dense], 1)).squeeze(1)  # [B]
        return linear.sum((1, 2)) + fm + deep + self.dense_linear(dense).squeeze(1)  # logits [B]


class TnDeepFM(tn.Model):
    def __init__(self):
        super().__init__()
        opt = AdaGrad(SPARSE_LR, initial_g2sum=G2, epsilon=EPS)
        cat = {k: fc.category_column(k) for k, _ in FIELDS}
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(cat[k], DIM, combiner=c) for k, c in FIELDS], opt, seed=5
        )
        self.linear = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(cat[k], 1, combiner=c) for k, c in FIELDS], opt, seed=5
        )
        self.head = DenseHead()

    def forward_dense(self, pooled, dense):
        return self.head(torch.stack(pooled["emb"], 1), torch.stack(pooled["linear"], 1), dense)


class Reference:
    """Plain PyTorch: fixed tables over every key of the data, row-wise AdaGrad written out."""

    def __init__(self, head, batches):
        self.head = head
        self.keys = np.unique(
            np.concatenate([b.sparse[k].keys for b in batches for k, _ in FIELDS])
        )
        self.tables = {}
        for name, dim in (("emb", DIM), ("linear", 1)):
            init = SparseTable(dim, AdaGrad(), name=name, seed=5, initializer=normal(1.0))
            w = torch.from_numpy(init.pull(self.keys)).requires_grad_(
                True
            )  # same (seed, name, key)
            self.tables[name] = (w, torch.full((len(self.keys),), G2, dtype=torch.float64))
        self.opt = torch.optim.Adam(head.parameters(), lr=DENSE_LR)

    def pool(self, w, batch, name, combiner):
        jag = batch.sparse[name]
        ids = torch.from_numpy(np.searchsorted(self.keys, jag.keys))
        return F.embedding_bag(ids, w, torch.from_numpy(jag.offsets[:-1]), mode=combiner)

    def step(self, batch):
        pooled = {
            t: torch.stack([self.pool(w, batch, k, c) for k, c in FIELDS], 1)
            for t, (w, _) in self.tables.items()
        }
        logits = self.head(pooled["emb"], pooled["linear"], torch.from_numpy(batch.dense))
        loss = F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels[:, 0]))
        self.opt.zero_grad()
        for w, _ in self.tables.values():
            w.grad = None
        loss.backward()
        touched = np.unique(
            np.searchsorted(self.keys, np.concatenate([batch.sparse[k].keys for k, _ in FIELDS]))
        )
        with torch.no_grad():
            for w, g2 in self.tables.values():
                g = w.grad[touched].double()  # [T, D]
                g2[touched] += (g * g).mean(1)
                w[touched] -= (SPARSE_LR * g / (EPS + g2[touched].sqrt()[:, None])).float()
        self.opt.step()
        return float(loss.detach())


def test_fifty_steps_match_plain_pytorch(batches):
    data = batches(50, 64, seed=3)
    torch.manual_seed(0)
    model = TnDeepFM()
    ref = Reference(copy.deepcopy(model.head), data)
    model.compile(
        torch.optim.Adam(model.parameters(), lr=DENSE_LR), loss="binary_crossentropy_from_logits"
    )
    ours = [model.train_step(b)["loss"] for b in data]
    theirs = [ref.step(b) for b in data]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert ours[-1] < ours[0]  # it learns
    # the tables hold what the reference's fixed tables hold
    for name, (w, _) in ref.tables.items():
        got = model.tables[name].pull(ref.keys, create=False)
        np.testing.assert_allclose(got, w.detach().numpy(), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.head.parameters(), ref.head.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
