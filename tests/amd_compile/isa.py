"""Reading AMD ISA (amdgcn assembly) for the compile checks: instructions, registers, scratch."""

import re

# Unified register file per lane on CDNA3/CDNA4: 512 (256 arch VGPRs + 256 AGPRs). A kernel
# designed for two waves per SIMD must stay within half of it.
TWO_WAVES_PER_SIMD = 256


def instructions(amdgcn: str, prefix: str) -> set[str]:
    """Distinct mnemonics starting with ``prefix`` (e.g. "v_mfma")."""
    return set(re.findall(rf"\b{prefix}\w*", amdgcn))


def metadata_field(amdgcn: str, name: str) -> int | None:
    """An integer field of the kernel's metadata (".vgpr_count", ".private_segment_fixed_size")."""
    found = re.search(rf"\.{name}:\s+(\d+)", amdgcn)
    return int(found.group(1)) if found else None


def register_report(amdgcn: str) -> dict[str, int | None]:
    return {name: metadata_field(amdgcn, name) for name in (
        "vgpr_count", "agpr_count", "sgpr_count", "vgpr_spill_count", "sgpr_spill_count",
        "private_segment_fixed_size")}


def check_no_scratch(name: str, report: dict) -> None:
    """No spills and a zero private (scratch) segment."""
    assert report["private_segment_fixed_size"] == 0, (
        f"{name}: uses {report['private_segment_fixed_size']} B of scratch per lane "
        f"(spills {report['vgpr_spill_count']} VGPRs); shrink its tiles or registers")
    assert not report["vgpr_spill_count"] and not report["sgpr_spill_count"], (
        f"{name}: spills registers ({report})")


def unified_vgprs(report: dict) -> int:
    """Registers per lane out of the unified file: on gfx90a and later (gfx942, gfx950) the
    metadata's ``.vgpr_count`` already is arch VGPRs plus AGPRs (the listing's
    "TotalNumVgprs"); ``.agpr_count`` is the AGPR part of it, not an addition."""
    return report["vgpr_count"] or 0


def check_registers(name: str, report: dict, max_registers: int) -> None:
    """VGPRs + AGPRs within the occupancy the kernel was designed for."""
    used = unified_vgprs(report)
    assert used <= max_registers, (
        f"{name}: {used} VGPR+AGPR per lane, over the design budget of {max_registers}")
