"""Five scripts of the official PyTorch examples (github.com/pytorch/examples), each
ported to runmodel as a user would write it and checked bit for bit against its plain
loop (every number it prints, and the final weights) on data generated here or
scikit-learn's bundled digits, cut small:

* ``regression/main.py``: a hand-written update (no optimizer), stopped by the loss;
* ``time_sequence_prediction/train.py``: L-BFGS, a closure optimizer, here with gradient
  clipping inside the closure (``GradClip``), evaluated after every step;
* ``word_language_model/main.py``: an LSTM whose hidden state runs on from batch to
  batch, trained by a hand-written update with clipping, evaluated at another batch size
  than it trains with (``eval_start`` starts the pass afresh), its learning rate
  annealed when the validation loss does not improve, a log line every few batches of
  each epoch (``every="Nest"``);
* ``vae/main.py``: a VAE whose loss is a sum (binary cross-entropy + KL divergence), its
  test loss the batches' sums over the test set (``Evaluate(loss_reduction="sum")``),
  sampling in training, in evaluation and after it (``Evaluate`` leaves torch's
  generator as its evaluation's draws left it, as the script does);
* ``mnist_rnn/main.py``: an LSTM classifier ending in ``log_softmax``, trained with the
  function ``F.nll_loss`` (accuracy among its default metrics, as ``nn.NLLLoss()``), its
  test line a ``reduction="sum"`` loss and a count of correct answers, ``StepLR`` per
  epoch (``LRSchedule(interval="epoch")``).

No port has a hook of its own that evaluates, clips, schedules the learning rate or
saves: those are the packs'; its hooks print.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import runmodel
from runmodel.packs import Evaluate, GradClip, LRSchedule
from runmodel.packs.metric_watcher import MetricWatcher

from helpers import assert_equal_params


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Thousands of tiny ops (LSTM cells over short sequences): one thread runs them
    faster than two, and far faster on a busy machine, where two threads spin on each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# -- regression: y = a polynomial of degree 4, learned by a hand-written SGD update -------------

POLY_DEGREE = 4


def make_features(x: torch.Tensor) -> torch.Tensor:
    x = x.unsqueeze(1)
    return torch.cat([x**i for i in range(1, POLY_DEGREE + 1)], 1)


class PolyBatches:
    """``get_batch()`` of the example, for ever: each batch drawn from torch's generator
    when the loop asks for it."""

    def __init__(self, w: torch.Tensor, b: torch.Tensor) -> None:
        self.w, self.b = w, b

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            x = make_features(torch.randn(32))
            yield x, x.mm(self.w) + self.b.item()


def regression_target() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(POLY_DEGREE, 1) * 5, torch.randn(1) * 5


def regression_plain() -> tuple[nn.Module, int, float]:
    w, b = regression_target()
    fc = nn.Linear(POLY_DEGREE, 1)
    batches = iter(PolyBatches(w, b))
    for batch_idx in range(1, 5001):  # noqa: B007  # the count is the result
        batch_x, batch_y = next(batches)
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        if loss < 1e-3:
            break
    return fc, batch_idx, loss


class Poly(runmodel.TorchModel):
    def __init__(self, device: Any = None, init_options: Any = None) -> None:
        super().__init__(device, init_options)
        self.w, self.b = regression_target()
        self.module = nn.Linear(POLY_DEGREE, 1)

    def setup(self, setup_options: Any = None) -> None:
        self.loss_fn = F.smooth_l1_loss  # no optimizer: the update is written below
        self.train_data = PolyBatches(self.w, self.b)


def test_regression_with_a_hand_written_update_and_no_optimizer() -> None:
    engine = runmodel.Engine()
    losses: list[float] = []

    @engine.override("optimizer_step")
    def sgd(engine: runmodel.Engine, default: Any) -> None:
        module = engine.model.module
        for param in module.parameters():
            param.data.add_(-0.1 * param.grad)
        module.zero_grad()

    @engine.on("runstep")
    def stop_once_fitted(engine: runmodel.Engine) -> None:
        losses.append(engine.state.loss.item())
        if losses[-1] < 1e-3:
            engine.stop("fitted")

    model = Poly(device="cpu")
    result = engine.run(model, steps=5000)
    fc, batches, loss = regression_plain()
    assert result.ended == "stopped" and result.steps == batches and losses[-1] == loss
    assert torch.equal(model.module.weight, fc.weight) and torch.equal(model.module.bias, fc.bias)


# -- time-sequence prediction: two LSTM cells, L-BFGS ----------------------------------------------


class Sequence(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def sine_waves() -> torch.Tensor:
    """``generate_sine_wave.py``, cut to 5 waves of 24 points."""
    rng = np.random.RandomState(2)
    t, length, waves = 20, 24, 5
    x = np.empty((waves, length), "int64")
    x[:] = np.array(range(length)) + rng.randint(-4 * t, 4 * t, waves).reshape(waves, 1)
    return torch.from_numpy(np.sin(x / 1.0 / t).astype("float64"))


STEPS, CLIP = 2, 1.0


def time_sequence_plain() -> tuple[nn.Module, list[float], list[float]]:
    data = sine_waves()
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    torch.manual_seed(0)
    seq = Sequence().double()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
    closure_losses, test_losses = [], []
    for _ in range(STEPS):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            closure_losses.append(loss.item())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(seq.parameters(), CLIP)
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            future = 10
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            total = len(test_input) * loss.item()  # a script's mean over its one batch
            test_losses.append(total / len(test_input))
    return seq, closure_losses, test_losses


class SineModel(runmodel.TorchModel):
    def __init__(self, device: Any = None, init_options: Any = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(0)
        self.module = Sequence().double()

    def setup(self, setup_options: Any = None) -> None:
        data = sine_waves()
        self.optimizer = torch.optim.LBFGS(self.module.parameters(), lr=0.8)
        self.loss_fn = nn.MSELoss()
        self.train_data = [(data[3:, :-1], data[3:, 1:])]  # one step an epoch: the whole set
        self.eval_data = [(data[:3, :-1], data[:3, 1:])]


def test_time_sequence_prediction_with_lbfgs_and_gradient_clipping() -> None:
    engine = runmodel.Engine(GradClip(max_norm=CLIP), Evaluate())
    closure_losses: list[float] = []
    test_losses: list[float] = []
    engine.on("forward", lambda e: closure_losses.append(e.state.loss.item()))  # each call
    engine.on(
        "epoch_end", lambda e: test_losses.append(e.state.metrics["eval_loss"]), after="evaluate"
    )
    model = SineModel(device="cpu")
    engine.run(model, epochs=STEPS)
    seq, plain_closure_losses, plain_test_losses = time_sequence_plain()
    assert len(closure_losses) > 2 * STEPS  # L-BFGS called the closure many times a step
    assert closure_losses == plain_closure_losses and test_losses == plain_test_losses
    for mine, theirs in zip(model.module.parameters(), seq.parameters(), strict=True):
        assert torch.equal(mine, theirs)


# -- word language model: an LSTM over a token stream ----------------------------------------------

VOCAB, EMSIZE, NHID, NLAYERS, DROPOUT = 30, 16, 16, 2, 0.2
TRAIN_BSZ, EVAL_BSZ, BPTT, CLIP_LM, LR, EPOCHS, LOG_INTERVAL = 8, 5, 6, 0.25, 20.0, 3, 4


class RNNModel(nn.Module):
    """``word_language_model/model.py``'s ``RNNModel`` for an LSTM."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(DROPOUT)
        self.encoder = nn.Embedding(VOCAB, EMSIZE)
        self.rnn = nn.LSTM(EMSIZE, NHID, NLAYERS, dropout=DROPOUT)
        self.decoder = nn.Linear(NHID, VOCAB)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def forward(self, input: torch.Tensor, hidden: Any) -> tuple[torch.Tensor, Any]:
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, VOCAB)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int) -> tuple[torch.Tensor, torch.Tensor]:
        weight = next(self.parameters())
        return (weight.new_zeros(NLAYERS, bsz, NHID), weight.new_zeros(NLAYERS, bsz, NHID))


def corpus(tokens: int, seed: int) -> torch.Tensor:
    """A token stream with structure to learn: each token mostly follows from the last."""
    g = torch.Generator().manual_seed(seed)
    stream = [0]
    for noise in torch.rand(tokens - 1, generator=g).tolist():
        stream.append((stream[-1] * 7 + 3) % VOCAB if noise < 0.7 else int(noise * 1000) % VOCAB)
    return torch.tensor(stream)


def batchify(data: torch.Tensor, bsz: int) -> torch.Tensor:
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def get_batch(source: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    seq_len = min(BPTT, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].view(-1)


def repackage_hidden(h: Any) -> Any:
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def word_lm_data() -> tuple[torch.Tensor, torch.Tensor]:
    return batchify(corpus(2000, 1), TRAIN_BSZ), batchify(corpus(1000, 2), EVAL_BSZ)


def word_lm_plain() -> tuple[nn.Module, list[float], list[float], list[float]]:
    """``main.py`` without ``--use-optimizer``, its log line at every LOG_INTERVAL-th
    batch of an epoch (the original's ``batch % interval == 0 and batch > 0`` logs the
    sum of interval + 1 losses first)."""
    train_data, val_data = word_lm_data()
    torch.manual_seed(1111)
    model = RNNModel()
    criterion = nn.NLLLoss()
    lr, best_val_loss, logged, val_losses, lrs = LR, None, [], [], []

    def evaluate(data_source: torch.Tensor) -> float:
        model.eval()
        total_loss = 0.0
        hidden = model.init_hidden(EVAL_BSZ)
        with torch.no_grad():
            for i in range(0, data_source.size(0) - 1, BPTT):
                data, targets = get_batch(data_source, i)
                output, hidden = model(data, hidden)
                hidden = repackage_hidden(hidden)
                total_loss += len(data) * criterion(output, targets).item()
        return total_loss / (len(data_source) - 1)

    for _ in range(EPOCHS):
        model.train()
        total_loss = 0.0
        hidden = model.init_hidden(TRAIN_BSZ)
        for batch, i in enumerate(range(0, train_data.size(0) - 1, BPTT)):
            data, targets = get_batch(train_data, i)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data, hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_LM)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            total_loss += loss.item()
            if (batch + 1) % LOG_INTERVAL == 0:
                logged.append(total_loss / LOG_INTERVAL)
                total_loss = 0
        val_loss = evaluate(val_data)
        val_losses.append(val_loss)
        if not best_val_loss or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            lr /= 4.0
        lrs.append(lr)
    return model, logged, val_losses, lrs


class WordLM(runmodel.TorchModel):
    """The port: the hidden state lives on the model and runs on from batch to batch."""

    def __init__(self, device: Any = None, init_options: Any = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(1111)
        self.module = RNNModel()
        self.hidden: Any = None
        self.lr = LR

    def setup(self, setup_options: Any = None) -> None:
        train_data, val_data = word_lm_data()
        self.loss_fn = nn.NLLLoss()  # no optimizer: the update is the script's own
        self.train_data = [get_batch(train_data, i) for i in range(0, train_data.size(0) - 1, BPTT)]
        self.eval_data = [get_batch(val_data, i) for i in range(0, val_data.size(0) - 1, BPTT)]

    def compute_output(self, batch: Any) -> torch.Tensor:
        output, self.hidden = self.module(batch[0], repackage_hidden(self.hidden))
        return output


def word_lm_engine() -> tuple[runmodel.Engine, list[float], list[float], list[float]]:
    engine = runmodel.Engine(Evaluate(), GradClip(max_norm=CLIP_LM))
    logged: list[float] = []
    val_losses: list[float] = []
    lrs: list[float] = []
    since_log = [0.0]  # the losses' running sum, in float as the script adds them
    # every pass starts with a fresh state of its own batch size: a training epoch...
    engine.on(
        "epoch_start",
        lambda e: setattr(e.model, "hidden", e.model.module.init_hidden(TRAIN_BSZ)),
        modes="train",
    )
    # ...and an evaluation (Evaluate's, inside epoch_end)
    engine.on(
        "eval_start", lambda e: setattr(e.model, "hidden", e.model.module.init_hidden(EVAL_BSZ))
    )

    @engine.override("optimizer_step")
    def sgd(engine: runmodel.Engine, default: Any) -> None:
        model = engine.model
        for p in model.module.parameters():
            p.data.add_(p.grad, alpha=-model.lr)
        model.module.zero_grad()

    @engine.on("runstep", priority=1)
    def add_loss(engine: runmodel.Engine) -> None:
        since_log[0] += engine.state.loss.item()

    @engine.on("runstep", every=f"{LOG_INTERVAL}est")  # every LOG_INTERVAL-th batch of an epoch
    def log(engine: runmodel.Engine) -> None:
        logged.append(since_log[0] / LOG_INTERVAL)
        since_log[0] = 0.0

    engine.on("epoch_start", lambda e: since_log.__setitem__(0, 0.0))
    watcher = MetricWatcher("eval_loss", "min")

    @engine.on("epoch_end", after="evaluate", reads="eval_loss")
    def anneal(engine: runmodel.Engine) -> None:
        val_losses.append(engine.state.metrics["eval_loss"])
        if not watcher.check(engine.state):
            engine.model.lr /= 4.0
        lrs.append(engine.model.lr)

    return engine, logged, val_losses, lrs


def test_word_language_model_evaluated_at_another_batch_size() -> None:
    engine, logged, val_losses, lrs = word_lm_engine()
    model = WordLM(device="cpu")
    engine.run(model, epochs=EPOCHS)
    plain, plain_logged, plain_val_losses, plain_lrs = word_lm_plain()
    assert len(logged) == EPOCHS * (len(model.train_data) // LOG_INTERVAL)
    assert val_losses == plain_val_losses and lrs == plain_lrs and logged == plain_logged
    assert lrs[-1] < LR  # a validation loss that did not improve annealed the rate
    for mine, theirs in zip(model.module.parameters(), plain.parameters(), strict=True):
        assert torch.equal(mine, theirs)


# -- shared by the next two: scikit-learn's bundled 8x8 digits, a small cut of them ---------------


@functools.cache
def digits(train: int, test: int) -> tuple[TensorDataset, TensorDataset]:
    """The first ``train`` digits and the next ``test``, as float images in [0, 1] of
    shape (8, 8) (MNIST's 28x28 in the examples) and their labels."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    images = torch.tensor(x[: train + test], dtype=torch.float32).view(-1, 8, 8) / 16
    labels = torch.tensor(y[: train + test])
    return (
        TensorDataset(images[:train], labels[:train]),
        TensorDataset(images[train:], labels[train:]),
    )


def digit_loaders(batch_size: int, test_batch_size: int) -> tuple[DataLoader[Any], ...]:
    """The examples' loaders: the training set shuffled by torch's global generator, the
    test set in order (its iterators draw a seed from that generator all the same)."""
    train_set, test_set = digits(320, 160)
    return (
        DataLoader(train_set, batch_size=batch_size, shuffle=True),
        DataLoader(test_set, batch_size=test_batch_size, shuffle=False),
    )


def progress_line(epoch: int, batch_idx: int, rows: int, loader: Any, loss: float) -> str:
    """Both examples' ``Train Epoch`` line."""
    return "Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(  # noqa: UP032
        epoch, batch_idx * rows, len(loader.dataset), 100.0 * batch_idx / len(loader), loss
    )


# -- vae/main.py: a variational auto-encoder, its test loss a sum over the test set ---------------

VAE_EPOCHS, VAE_BATCH, VAE_LOG = 3, 32, 4


class VAE(nn.Module):
    """The example's ``VAE`` with its 784-400-20 cut to 64-32-4."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, 64)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)  # drawn in training and in evaluation alike
        return mu + eps * std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encode(x.view(-1, 64))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def vae_loss(recon_x: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor) -> Any:
    """The example's ``loss_function``: reconstruction + KL divergence, summed over the batch."""
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 64), reduction="sum")
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def vae_plain() -> tuple[nn.Module, list[str], list[float]]:
    """``main.py`` as written (its images not saved): train, test and a sample each epoch."""
    torch.manual_seed(1)
    train_loader, test_loader = digit_loaders(VAE_BATCH, VAE_BATCH)
    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    printed, test_losses = [], []

    def train(epoch: int) -> None:
        model.train()
        train_loss = 0.0
        for batch_idx, (data, _) in enumerate(train_loader):
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = vae_loss(recon_batch, data, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            if batch_idx % VAE_LOG == 0:
                printed.append(
                    progress_line(
                        epoch, batch_idx, len(data), train_loader, loss.item() / len(data)
                    )
                )
        printed.append(
            f"====> Epoch: {epoch} Average loss: {train_loss / len(train_loader.dataset):.4f}"
        )

    def test(epoch: int) -> None:
        model.eval()
        test_loss = 0.0
        with torch.no_grad():
            for data, _ in test_loader:
                recon_batch, mu, logvar = model(data)
                test_loss += vae_loss(recon_batch, data, mu, logvar).item()
        test_loss /= len(test_loader.dataset)
        test_losses.append(test_loss)
        printed.append(f"====> Test set loss: {test_loss:.4f}")

    for epoch in range(1, VAE_EPOCHS + 1):
        train(epoch)
        test(epoch)
        with torch.no_grad():
            model.decode(torch.randn(64, 4))  # save_image(...) of 64 samples
    return model, printed, test_losses


class VAEModel(runmodel.TorchModel):
    """The port: the target is the input; the loss takes the module's three outputs and
    ``reduction="sum"`` (it is a sum already)."""

    def __init__(self, device: Any = None, init_options: Any = None) -> None:
        super().__init__(device, init_options)
        torch.manual_seed(1)
        self.loaders = digit_loaders(VAE_BATCH, VAE_BATCH)
        self.module = VAE()

    def setup(self, setup_options: Any = None) -> None:
        self.optimizer = torch.optim.Adam(self.module.parameters(), lr=1e-3)
        self.loss_fn = lambda out, x, reduction="sum": vae_loss(out[0], x, out[1], out[2])
        self.train_data, self.eval_data = self.loaders

    def target(self, batch: Any) -> Any:
        return batch[0]


def test_vae_its_test_loss_a_sum_over_the_test_set() -> None:
    plain, expected, expected_losses = vae_plain()
    # Evaluate's loss as the example's test(): the batches' sums over the test set's size
    engine = runmodel.Engine(Evaluate(loss_reduction="sum"))
    printed: list[str] = []
    test_losses: list[float] = []
    train_loss = [0.0]

    @engine.on("runstep")
    def log(engine: runmodel.Engine) -> None:
        s, data = engine.state, engine.state.batch[0]
        train_loss[0] += s.loss.item()
        if s.epoch_step % VAE_LOG == 0:
            loss = s.loss.item() / len(data)
            printed.append(progress_line(s.epoch + 1, s.epoch_step, len(data), loader, loss))

    @engine.on("epoch_end", after="evaluate")
    def epoch_lines(engine: runmodel.Engine) -> None:
        average = train_loss[0] / len(loader.dataset)
        printed.append(f"====> Epoch: {engine.state.epoch + 1} Average loss: {average:.4f}")
        test_losses.append(engine.state.metrics["eval_loss"])
        printed.append(f"====> Test set loss: {test_losses[-1]:.4f}")
        train_loss[0] = 0.0
        with torch.no_grad():
            engine.model.module.decode(torch.randn(64, 4))  # the example's samples

    model = VAEModel(device="cpu")
    loader = model.loaders[0]
    engine.run(model, epochs=VAE_EPOCHS)
    assert printed == expected and len(printed) == VAE_EPOCHS * 5
    assert test_losses == expected_losses
    assert_equal_params(model, plain)


# -- mnist_rnn/main.py: an LSTM classifier, log_softmax and F.nll_loss, StepLR per epoch ----------

RNN_EPOCHS, RNN_BATCH, RNN_TEST_BATCH, RNN_LOG = 3, 32, 64, 4


class RNNNet(nn.Module):
    """The example's ``Net`` over 8 rows of 8 pixels (28 of 28 there), its hidden size
    64 cut to 16; ``Dropout`` for its ``Dropout2d`` (which warns on (N, C) input that
    this use is deprecated)."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(input_size=8, hidden_size=16, batch_first=True)
        self.batchnorm = nn.BatchNorm1d(16)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        input = input.reshape(-1, 8, 8)
        output, _ = self.rnn(input)
        output = self.batchnorm(output[:, -1, :])
        output = self.dropout1(output)
        output = F.relu(self.fc1(output))
        output = self.dropout2(output)
        return F.log_softmax(self.fc2(output), dim=1)


def result_line(loss: float, correct: int, total: int) -> str:
    return "\\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\\n".format(  # noqa: UP032
        loss, correct, total, 100.0 * correct / total
    )


def rnn_plain() -> tuple[nn.Module, list[str], list[tuple[float, int]]]:
    """``main.py`` as written: Adadelta, ``StepLR(step_size=1, gamma=0.7)`` stepped after
    each epoch's test."""
    torch.manual_seed(1)
    train_loader, test_loader = digit_loaders(RNN_BATCH, RNN_TEST_BATCH)
    model = RNNNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    printed, tests = [], []
    for epoch in range(1, RNN_EPOCHS + 1):
        model.train()
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            if batch_idx % RNN_LOG == 0:
                printed.append(
                    progress_line(epoch, batch_idx, len(data), train_loader, loss.item())
                )
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for data, target in test_loader:
                output = model(data)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(dim=1, keepdim=True)
                correct += pred.eq(target.view_as(pred)).sum().item()
        test_loss /= len(test_loader.dataset)
        tests.append((test_loss, correct))
        printed.append(result_line(test_loss, correct, len(test_loader.dataset)))
        scheduler.step()
    return model, printed, tests


def test_rnn_classifier_with_f_nll_loss() -> None:
    plain, expected, expected_tests = rnn_plain()
    torch.manual_seed(1)
    train_loader, test_loader = digit_loaders(RNN_BATCH, RNN_TEST_BATCH)
    module = RNNNet()
    model = runmodel.TorchModel.from_parts(
        module,
        optimizer=lambda params: torch.optim.Adadelta(params, lr=0.1),
        loss_fn=F.nll_loss,  # the function: eval_accuracy as for nn.NLLLoss()
        train_data=train_loader,
        eval_data=test_loader,
        device="cpu",
    )
    engine = runmodel.Engine(
        Evaluate(loss_reduction="sum"),  # the example's reduction="sum" test loss
        LRSchedule(
            lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7),
            interval="epoch",
        ),
    )
    printed: list[str] = []
    tests: list[tuple[float, int]] = []
    engine.on(
        "runstep",
        lambda e: printed.append(
            progress_line(
                e.state.epoch + 1,
                e.state.epoch_step,
                len(e.state.batch[0]),
                train_loader,
                e.state.loss.item(),
            )
        ),
        when=lambda e: e.state.epoch_step % RNN_LOG == 0,
    )

    @engine.on("epoch_end", after="evaluate")
    def test_result(engine: runmodel.Engine) -> None:
        total = len(test_loader.dataset)
        metrics = engine.state.metrics
        tests.append((metrics["eval_loss"], round(metrics["eval_accuracy"] * total)))
        printed.append(result_line(*tests[-1], total))

    engine.run(model, epochs=RNN_EPOCHS)
    assert printed == expected and tests == expected_tests
    assert len({correct for _, correct in tests}) > 1  # it learns
    assert_equal_params(module, plain)
