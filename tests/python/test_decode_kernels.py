"""bench/decode_kernels.py's reading of an ncu report, on a report written here: the program's
own output before the table skipped, one decode step found between embedding launches (the
ones whose launches hold the decode attention), its first layer and the sums by kernel. And its
reading of a torch.profiler trace: the kernels in start order, the time each added to the step
when kernels overlap or wait."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import decode_kernels as dk  # noqa: E402

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
        '"Metric Value"')


def report(kernels):
    """kernels: (name, grid x, microseconds, bytes read), in launch order."""
    lines = ["generate: 1 sequence, greedy", "==PROF== not a row", HEAD]
    for i, (name, gx, us, read) in enumerate(kernels):
        for metric, value in (("gpu__time_duration.sum", us * 1000), ("dram__bytes_read.sum", read),
                              ("dram__bytes_write.sum", 0)):
            lines.append(f'"{i}","1","stof","h","{name}","1","15","(128, 1, 1)","({gx}, 1, 1)",'
                         f'"0","9.0","Command line profiler metrics","{metric}","x",'
                         f'"{value:,.0f}"')
    return "\n".join(lines)


def layer(attention_us):
    return [("stof_mi_chain", 1, 3.0, 1e4), ("nvjet_sm90_hsh_64x8_v_bz_TNT", 4, 7.0, 12e6),
            ("stof_attention_decode", 8, attention_us, 3e5)]


def test_one_step_of_a_report():
    prefill = [("stof_embedding", 128, 3.0, 5e5), ("stof_attention_block", 16, 9.0, 1e6)]
    step = [("stof_embedding", 1, 2.0, 1e4)] + layer(10.0) + layer(11.0) + \
        [("stof_argmax_rows", 1, 12.0, 1e5)]
    kernels = dk.read_report(report(prefill + step + step + [("stof_embedding", 1, 2.0, 1e4)]))
    assert len(kernels) == 2 + 2 * len(step) + 1
    assert kernels[2]["gpu__time_duration.sum"] == 2000.0
    got = dk.last_step(kernels)
    assert [k["name"] for k in got] == [k[0] for k in step]
    assert dk.step_layers(got) == 2
    assert [k["name"] for k in dk.first_layers(got, 1)] == [k[0] for k in step[:4]]
    text = "\n".join(dk.tables(got, 1, 24.0, 4800.0))
    assert "| cuBLASLt GEMM sm90_hsh_64x8_v_bz_TNT | 2 | 14.0 |" in text
    assert "| stof_attention_decode | 2 | 21.0 |" in text
    assert "| all | 8 | 55.0 | 100% |" in text
    assert "The step's weights: 24.0 MB, 5.0 us at 4800 GB/s" in text


def test_wide_model():
    """A model wider than 2048 at batch 1 embeds its token with several blocks; a short prompt
    embeds with few: the steps are told by their decode attention, not by the grid."""
    prefill = [("stof_embedding", 2, 3.0, 5e5), ("stof_attention_block", 16, 9.0, 1e6)]
    step = [("stof_embedding", 4, 2.0, 1e4)] + layer(10.0) + [("stof_argmax_rows", 1, 12.0, 1e5)]
    kernels = dk.read_report(report(prefill + step + step + [("stof_embedding", 4, 2.0, 1e4)]))
    got = dk.last_step(kernels)
    assert [k["name"] for k in got] == [k[0] for k in step]
    assert got[0] is kernels[2 + len(step)]


def test_errors():
    for bad in ("no table here", report([("stof_embedding", 1, 2.0, 0)])):
        try:
            dk.last_step(dk.read_report(bad))
        except ValueError as e:
            assert "ncu table" in str(e) or "fewer than two decode steps" in str(e)
        else:
            raise AssertionError("accepted")


def trace(kernels, other=()):
    """kernels: (name, start us, duration us), written out of order among other events."""
    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.5,
               "dur": 1.0}] + list(other)
    events += [{"ph": "X", "cat": "kernel", "name": n, "ts": t, "dur": d,
                "args": {"grid": [1, 1, 1]}} for n, t, d in reversed(kernels)]
    return json.dumps({"schemaVersion": 1, "traceEvents": events})


def test_timeline_of_a_trace():
    # a step: the qkv GEMM starts before the norm ends (programmatic dependent launch), the
    # attention waits 1 us after it, the o GEMM ends inside the attention's time
    step = [("stof_embedding", 0.0, 2.0), ("stof_mi_chain", 2.0, 2.0),
            ("nvjet_sm90_hsh_64x8_v_bz_TNT", 3.0, 5.0), ("stof_attention_decode", 9.0, 8.0),
            ("stof_gemv", 10.0, 6.0), ("stof_argmax_rows", 17.5, 1.5)]
    prefill = [("stof_embedding", -50.0, 3.0), ("stof_attention_block", -40.0, 9.0)]
    shift = lambda ks, dt: [(n, t + dt, d) for n, t, d in ks]  # noqa: E731
    kernels = dk.read_trace(trace(prefill + step + shift(step, 30.0) + shift(step[:1], 60.0),
                                  [{"ph": "i", "cat": "kernel", "name": "marker", "ts": 1.0}]))
    assert [k["name"] for k in kernels[:3]] == ["stof_embedding", "stof_attention_block",
                                                "stof_embedding"]
    got = dk.last_step(kernels)
    assert [(k["name"], k["start"]) for k in got] == [(n, t + 30.0) for n, t, _ in step]
    assert dk.time_added(got) == [2.0, 2.0, 4.0, 9.0, 0.0, 2.0]
    text = "\n".join(dk.timeline_tables(got, 1, 0.0, 4800.0))
    assert "| 3 | stof_attention_decode | 9.0 | 8.0 | 9.0 |" in text
    assert "| 4 | stof_gemv | 10.0 | 6.0 | 0.0 |" in text
    assert "| cuBLASLt GEMM sm90_hsh_64x8_v_bz_TNT | 1 | 5.0 | 4.0 | 21.1% |" in text
    assert "| all | 6 | 24.5 | 19.0 | 100% |" in text
    weights = "\n".join(dk.timeline_tables(got, 1, 48.0, 4800.0))
    assert "The step's weights: 48.0 MB, 10.0 us at 4800 GB/s; the step took 1.9x that." in weights


def test_trace_errors():
    for bad, why in (("{not json", "not a Chrome trace"), ("[1, 2]", "not a Chrome trace"),
                     ('{"traceEvents": 3}', "no list of traceEvents"),
                     (trace([]), "no GPU kernels in the trace"),
                     ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1}]}',
                      "without a name, a start (ts) or a duration")):
        try:
            dk.read_trace(bad)
        except ValueError as e:
            assert why in str(e), (bad, str(e))
        else:
            raise AssertionError(f"accepted {bad!r}")


if __name__ == "__main__":
    test_one_step_of_a_report()
    test_wide_model()
    test_errors()
    test_timeline_of_a_trace()
    test_trace_errors()
    print("test_decode_kernels: ok")
