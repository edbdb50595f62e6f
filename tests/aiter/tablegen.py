"""Tuned tables in aiter's CSV format with rows of this project's own making.

Nothing here is taken from aiter's shipped tables: the column names are the format (what aiter's
readers look up), the kernel names and shapes are invented (they only follow the naming pattern
the routing data's prefixes describe). ``write_configs`` lays out a ``configs/`` folder shaped like
a real one (a default, overlays in ``model_configs/``, an untuned sibling, opus rows in the bf16
tables), with the dirt real tables carry where the tests need it.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

BPS = "a8w8_blockscale_bpreshuffle_tuned_gemm"
GEMM_HEADER = "gfx,cu_num,M,N,K,libtype,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
NO_LIBTYPE_HEADER = "gfx,cu_num,M,N,K,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
OLD_NO_LIBTYPE_HEADER = "cu_num,M,N,K,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
A8W8_HEADER = "gfx,cu_num,M,N,K,q_dtype_w,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
BATCHED_HEADER = "gfx,cu_num,B,M,N,K,kernelId,splitK,us,kernelName,tflops,bw,errRatio"
BF16_HEADER = (
    "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,"
    "kernelName,err_ratio,tflops,bw"
)


def ck_name(n: int, prefix: str = "a8w8_blockscale_bpreshuffle_") -> str:
    """An invented ck kernel name (``n`` makes it unique)."""
    return f"{prefix}1x128x128_{64 + n}x{16 * (n % 4 + 1)}x128x128_hal0_test_intrawave_v{n % 3 + 1}"


def cktile_name(n: int) -> str:
    return f"a8w8_blockscale_cktile_{32 + n}x64x256_hal0_test_v{n % 2 + 1}"


def asm_name(n: int) -> str:
    return f"_ZN5aiter{30 + len(str(n))}hal0_test_fp8gemm_blockscale_{n}x128E"


def gemm_row(
    gfx: str, cu: int, shape: tuple[int, int, int], *, libtype: str, kid: int, name: str, us: float
) -> str:
    m, n, k = shape
    return f"{gfx},{cu},{m},{n},{k},{libtype},{kid},0,{us},{name},1.0,2.0,0.0"


def table(header: str, rows: Iterable[str], *, final_newline: bool = True) -> str:
    text = "\n".join([header, *rows])
    return text + "\n" if final_newline else text


def bps_rows(
    gfx: str, cu: int, start_m: int, *, ck: Sequence[int], cktile: Sequence[int] = (), asm: int = 0
) -> list[str]:
    """Rows of the blockscale-bpreshuffle table: one shape per kernel, M counting up."""
    rows: list[str] = []
    m = start_m
    for n in ck:
        rows.append(
            gemm_row(gfx, cu, (m, 7168, 2048), libtype="ck", kid=n, name=ck_name(n), us=10.0 + n)
        )
        m += 1
    for n in cktile:
        rows.append(
            gemm_row(
                gfx, cu, (m, 7168, 2048), libtype="cktile", kid=n, name=cktile_name(n), us=9.0 + n
            )
        )
        m += 1
    for n in range(asm):
        rows.append(
            gemm_row(gfx, cu, (m, 7168, 2048), libtype="asm", kid=n, name=asm_name(n), us=8.0 + n)
        )
        m += 1
    return rows


def bf16_row(gfx: str, cu: int, m: int, libtype: str, *, solidx: int, name: str) -> str:
    return (
        f"{gfx},{cu},{m},1024,4096,False,torch.bfloat16,torch.bfloat16,False,False,{libtype},"
        f"{solidx},0,12.5,{name},0.0,1.0,2.0"
    )


def write_configs(configs: Path) -> Path:
    """A configs folder in e4048607's layout, with rows of this project's own making:

    - the blockscale-bpreshuffle default: gfx950:256 ck kernels 0-7, asm rows;
    - overlays ``<stem>_glm5.2.csv`` (ck 2-7, cktile 0-1), ``<stem>_mm2.5.csv`` (ck 3-5) and ``glm5_<stem>.csv`` (gfx942:80 ck 20-23; gfx950:256 ck 2-6, cktile
      1-2): the default alone adds ck kernels 0 and 1;
    - an untuned overlay and the default's untuned sibling (header only, 5 bytes, ``M,N,K``);
    - bf16 tables with opus rows (ids) among asm, triton, flydsl and torch rows;
    - the a8w8 table (shape-keyed; q_dtype_w repeats) and the a8w8 batched table (gfx942:304,
      one cu-80 row).
    """
    mc = configs / "model_configs"
    mc.mkdir(parents=True, exist_ok=True)
    (configs / f"{BPS}.csv").write_text(
        table(GEMM_HEADER, bps_rows("gfx950", 256, 16, ck=range(8), asm=3))
    )
    (configs / "a8w8_blockscale_bpreshuffle_untuned_gemm.csv").write_bytes(b"M,N,K")
    (mc / f"{BPS}_glm5.2.csv").write_text(
        table(GEMM_HEADER, bps_rows("gfx950", 256, 100, ck=range(2, 8), cktile=(0, 1), asm=2))
    )
    (mc / f"{BPS}_mm2.5.csv").write_text(
        table(GEMM_HEADER, bps_rows("gfx950", 256, 200, ck=range(3, 6), asm=1))
    )
    (mc / "a8w8_blockscale_bpreshuffle_untuned_gemm_mm2.5.csv").write_text(
        table("M,N,K,q_dtype_w", [f"{m},7168,2048,torch.float8_e4m3fn" for m in (200, 201)])
    )
    (mc / f"glm5_{BPS}.csv").write_text(
        table(
            GEMM_HEADER,
            [
                *bps_rows("gfx942", 80, 300, ck=range(20, 24), asm=1),
                *bps_rows("gfx950", 256, 300, ck=range(2, 7), cktile=(1, 2), asm=1),
            ],
        )
    )
    (configs / "bf16_tuned_gemm.csv").write_text(
        table(
            BF16_HEADER,
            [
                *(
                    bf16_row("gfx950", 256, 8 + i, "opus", solidx=3 + i, name=f"opus_hal0_{i}")
                    for i in range(4)
                ),
                *(
                    bf16_row("gfx950", 256, 20 + i, "asm", solidx=i, name=asm_name(i))
                    for i in range(3)
                ),
                bf16_row("gfx950", 256, 30, "flydsl", solidx=0, name="flydsl_hal0_0"),
                *(bf16_row("gfx1250", 96, 8 + i, "triton", solidx=0, name="") for i in range(3)),
            ],
        )
    )
    (mc / "kimi_bf16_tuned_gemm.csv").write_text(
        table(
            BF16_HEADER,
            [
                bf16_row("gfx950", 256, 40, "opus", solidx=11, name="opus_hal0_11"),
                bf16_row("gfx950", 256, 41, "opus", solidx=12, name="opus_hal0_12"),
                bf16_row("gfx950", 256, 42, "torch", solidx=0, name="torch_hal0"),
                bf16_row("gfx950", 256, 43, "flydsl", solidx=0, name="flydsl_hal0_1"),
                bf16_row("gfx942", 80, 44, "opus", solidx=13, name="opus_hal0_13"),
            ],
        )
    )
    (configs / "a8w8_tuned_gemm.csv").write_text(table(A8W8_HEADER, a8w8_rows()))
    (configs / "a8w8_untuned_gemm.csv").write_text(table("M,N,K,q_dtype_w", []))
    (configs / "a8w8_tuned_batched_gemm.csv").write_text(
        table(
            BATCHED_HEADER,
            [
                *(
                    f"gfx942,304,16,{32 * (i + 1)},1280,8192,{i},0,{60 + i},"
                    f"a8w8_batched_rowwise_hal0_{i % 4}_intrawave_v3,1.0,2.0,0.0"
                    for i in range(6)
                ),
                "gfx942,80,16,32,1280,8192,0,0,70,a8w8_batched_rowwise_hal0_0_intrawave_v3,1,2,0",
            ],
        )
    )
    return configs


def a8w8_rows() -> list[str]:
    """The a8w8 table: gfx950:256 shapes, two of them repeated with the other q_dtype_w (int8
    and fp8, as aiter's shipped table does), one gfx942:80 row."""
    rows = [
        f"gfx950,256,{16 * (i + 1)},1280,8192,{dtype},{i},0,{20 + i},"
        f"a8w8_rowwise_{64 + i % 3}x16x64x512_hal0_intrawave_v3,1.0,2.0,0.0"
        for i in range(6)
        for dtype in (("torch.int8", "torch.float8_e4m3fnuz") if i < 2 else ("torch.int8",))
    ]
    rows.append("gfx942,80,1,1280,8192,torch.int8,0,0,20,a8w8_rowwise_64x16x64x512_hal0_v3,1,2,0")
    return rows


def _session_configs() -> Path:
    root = Path(tempfile.mkdtemp(prefix="hal0-aiter-configs-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return write_configs(root / "configs")


WRITTEN_CONFIGS = _session_configs()
"""One written configs folder per test process (read-only for the tests: they copy it)."""
