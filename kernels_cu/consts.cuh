// kvcanary: constants of the canary format (SPEC §2), in namespace kvc. The Python twin is kvcanary/consts.py;
// tests/ops/test_consts_sync.py parses this file and checks every value against it, so keep the
// one-definition-per-line shape: `constexpr <type> NAME = value;` and `enum Name : int { MEMBER = value, ... };`.
#pragma once

namespace kvc {

constexpr unsigned long long CANARY_CHAIN_ANCHOR = 0xC0FFEE1234567890ULL;
constexpr long long REQ_POOL_IDX_PADDING = 0;
constexpr long long TOKEN_TO_KV_SLOT_PADDING = 0;
constexpr int CANARY_FIELDS_PER_SLOT = 4;
constexpr int CANARY_SLOT_BYTES = 32;
constexpr int VIOLATION_FIELDS = 8;
constexpr int MAX_REAL_KV_SOURCES = 4;
constexpr int REAL_KV_LOAD_BYTES = 16;

constexpr unsigned long long SPLITMIX64_MUL1 = 0xBF58476D1CE4E5B9ULL;
constexpr unsigned long long SPLITMIX64_MUL2 = 0x94D049BB133111EBULL;

constexpr int FIELD_TOKEN = 0;
constexpr int FIELD_POSITION = 1;
constexpr int FIELD_PREV_HASH = 2;
constexpr int FIELD_REAL_KV_HASH = 3;

constexpr int VFIELD_KERNEL_KIND = 0;
constexpr int VFIELD_SLOT_IDX = 1;
constexpr int VFIELD_POSITION = 2;
constexpr int VFIELD_STORED_TOKEN = 3;
constexpr int VFIELD_EXPECTED_TOKEN = 4;
constexpr int VFIELD_STORED_CHAIN_HASH = 5;
constexpr int VFIELD_EXPECTED_AUX = 6;
constexpr int VFIELD_FAIL_REASON = 7;

constexpr long long LUT_OUT_OF_RANGE_SLOT = -2;
constexpr long long NO_SLOT = -1;

enum CanaryLaunchTag : int {
    HEAD_K_FULL = 0,
    HEAD_V_FULL = 1,
    TAIL_K_FULL = 2,
    TAIL_V_FULL = 3,
    SWEEP_K_FULL = 4,
    SWEEP_V_FULL = 5,
    HEAD_K_SWA = 6,
    HEAD_V_SWA = 7,
    TAIL_K_SWA = 8,
    TAIL_V_SWA = 9,
    SWEEP_K_SWA = 10,
    SWEEP_V_SWA = 11,
};

enum FailReason : int {
    VERIFY_CHAIN_HASH_MISMATCH = 1,
    VERIFY_POSITION_MISMATCH = 2,
    VERIFY_REAL_KV_HASH_MISMATCH = 4,
    WRITE_TOKEN_MISMATCH = 8,
    WRITE_POSITION_MISMATCH = 16,
    VERIFY_TOKEN_MISMATCH = 32,
    SLOT_OUT_OF_RANGE = 64,
};

enum RealKvHashMode : int {
    REAL_KV_NONE = 0,
    REAL_KV_PARTIAL = 1,
    REAL_KV_ALL = 2,
};

}  // namespace kvc
