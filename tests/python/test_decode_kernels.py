"""bench/decode_kernels.py's reading of an ncu report, on a report written here: the program's
own output before the table skipped, one decode step found between embedding launches (the
ones whose launches hold the decode attention), its first layer and the sums by kernel."""
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


if __name__ == "__main__":
    test_one_step_of_a_report()
    test_wide_model()
    test_errors()
    print("test_decode_kernels: ok")
