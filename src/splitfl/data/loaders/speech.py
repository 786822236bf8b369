"""Google Speech Commands v0.02 from its folder of WAV files.

Folder layout (the official tarball, as torchvision/torchaudio unpack it):
``root/SpeechCommands/speech_commands_v0.02/`` (also ``root/speech_commands_v0.02/`` or ``root``
itself) holding one folder per word ``<label>/<speaker>_nohash_<k>.wav`` plus
``validation_list.txt`` and ``testing_list.txt`` (one relative path ``<label>/<file>.wav`` per
line). ``_background_noise_`` (and any other folder starting with ``_`` or ``.``) is ignored.

Classes are the sorted label folder names (35 for v0.02; fewer if fewer folders are present).
Train = every WAV of a class folder that is in neither list (torchaudio's ``training`` subset);
test = the files of ``testing_list.txt`` (``test_split='testing'``, default) or of
``validation_list.txt`` (``test_split='validation'``); listed files that are absent are skipped.
Audio (16-bit PCM, mono, 16 kHz) becomes float32 ``sample / 32768`` in [-1, 1), zero-padded or
trimmed to 16,000 samples: ``[N, 1, 16000]`` (raw waveform at 16 kHz as in MergeSFL's CNN-S,
the PyTorch M5 tutorial). Writers are speaker ids (file name before ``_nohash_``) numbered in
sorted order over both splits. The full set is about 105k clips, ~6.7 GB as float32;
``max_per_class`` keeps the first files (sorted by path) of each class in each split.
An unreadable WAV or list file (truncated header, not RIFF, not UTF-8) is a one-line
:class:`~splitfl.data.base.DatasetFileError` naming it.
"""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import (
    ArrayDataset,
    DatasetBundle,
    DatasetNotFoundError,
    DatasetShape,
    register_dataset,
)
from splitfl.data.loaders._common import file_error, find_folder, reading

SAMPLE_RATE = 16_000
NUM_SAMPLES = 16_000  # one second
LIST_FILES = ["validation_list.txt", "testing_list.txt"]
SUBDIRS = ["SpeechCommands/speech_commands_v0.02", "speech_commands_v0.02"]
TEST_SPLITS = {"testing": "testing_list.txt", "validation": "validation_list.txt"}


def read_wav(path: Path, length: int = NUM_SAMPLES) -> np.ndarray:
    """16-bit mono 16 kHz WAV → float32 ``[length]`` in [-1, 1), zero-padded or trimmed."""
    with wave.open(str(path), "rb") as fh:
        if fh.getsampwidth() != 2 or fh.getnchannels() != 1 or fh.getframerate() != SAMPLE_RATE:
            raise file_error(
                "speech_commands",
                path,
                f"is not 16-bit mono {SAMPLE_RATE} Hz "
                f"({8 * fh.getsampwidth()}-bit, {fh.getnchannels()} ch, {fh.getframerate()} Hz)",
            )
        frames = fh.readframes(min(fh.getnframes(), length))
    samples = np.frombuffer(frames, dtype="<i2")
    out = np.zeros(length, dtype=np.float32)
    out[: len(samples)] = samples.astype(np.float32) / 32768.0
    return out


def speaker_of(rel_path: str) -> str:
    """Speaker id of ``<label>/<speaker>_nohash_<k>.wav``."""
    return rel_path.rsplit("/", 1)[-1].split("_nohash_")[0]


def _read_list(path: Path) -> list[str]:
    with reading("speech_commands", path):
        text = path.read_text(encoding="utf-8")
    lines = (line.strip().replace("\\", "/") for line in text.splitlines())
    return [line for line in lines if line]


def _cap(files: list[str], max_per_class: int | None) -> list[str]:
    files = sorted(files)
    if max_per_class is None:
        return files
    taken: dict[str, int] = {}
    out = []
    for rel in files:
        label = rel.split("/", 1)[0]
        if taken.get(label, 0) < max_per_class:
            taken[label] = taken.get(label, 0) + 1
            out.append(rel)
    return out


def _to_dataset(
    folder: Path, files: list[str], labels: dict[str, int], speakers: dict[str, int]
) -> ArrayDataset:
    x = np.empty((len(files), 1, NUM_SAMPLES), dtype=np.float32)
    for i, rel in enumerate(files):
        with reading("speech_commands", folder / rel):
            x[i, 0] = read_wav(folder / rel)
    y = np.asarray([labels[rel.split("/", 1)[0]] for rel in files], dtype=np.int64)
    w = np.asarray([speakers[speaker_of(rel)] for rel in files], dtype=np.int64)
    return ArrayDataset(torch.from_numpy(x), torch.from_numpy(y), w)


@register_dataset(
    "speech_commands",
    "Speech Commands v0.02 WAVs (root/SpeechCommands/speech_commands_v0.02/), 1x16000, 35 classes",
    shape=DatasetShape((1, 16000), 35),
)
def load_speech_commands(
    root: Path | None = None, test_split: str = "testing", max_per_class: int | None = None
) -> DatasetBundle:
    """Speech Commands v0.02: 1-second 16 kHz clips of 35 words, writers = speakers.

    Args:
        root: Folder holding ``SpeechCommands/speech_commands_v0.02/`` (or that folder itself).
        test_split: ``'testing'`` (``testing_list.txt``) or ``'validation'``
            (``validation_list.txt``); train never includes files of either list.
        max_per_class: Keep at most this many clips per class in each split (first in sorted
            path order); ``None`` keeps all.
    """
    if test_split not in TEST_SPLITS:
        raise ValueError(
            f"speech_commands: test_split must be 'testing' or 'validation', got {test_split!r}"
        )
    if max_per_class is not None and int(max_per_class) < 1:
        raise ValueError(f"speech_commands: max_per_class must be >= 1, got {max_per_class!r}")
    folder = find_folder(root, SUBDIRS, LIST_FILES, "speech_commands")
    classes = sorted(
        d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith(("_", "."))
    )
    if not classes:
        raise DatasetNotFoundError(
            f"speech_commands: no label folders in {folder}: expected <label>/*.wav next to "
            f"{', '.join(LIST_FILES)}"
        )
    labels = {name: i for i, name in enumerate(classes)}
    every = sorted(f"{c}/{p.name}" for c in classes for p in (folder / c).glob("*.wav"))
    lists = {name: set(_read_list(folder / name)) for name in LIST_FILES}
    held_out = lists["validation_list.txt"] | lists["testing_list.txt"]
    present = set(every)
    train_files = [rel for rel in every if rel not in held_out]
    test_files = [rel for rel in lists[TEST_SPLITS[test_split]] if rel in present]
    if not test_files:  # an empty or damaged list names the file, not just the folder
        raise file_error(
            "speech_commands", folder / TEST_SPLITS[test_split], "lists no WAV file that exists"
        )
    cap = None if max_per_class is None else int(max_per_class)
    train_files, test_files = _cap(train_files, cap), _cap(test_files, cap)
    speakers = {s: i for i, s in enumerate(sorted({speaker_of(r) for r in every}))}
    train = _to_dataset(folder, train_files, labels, speakers)
    test = _to_dataset(folder, test_files, labels, speakers)
    return DatasetBundle("speech_commands", train, test, len(classes), (1, NUM_SAMPLES))
