// kvcanary: constants of the canary format (SPEC §2). The Python twin is kvcanary/consts.py;
// tests/test_consts_sync.py parses this file and checks every value against it, so keep the
// one-definition-per-line shape: `#define NAME value` and `enum Name { MEMBER = value, ... };`.
#pragma once

#define CANARY_CHAIN_ANCHOR 0xC0FFEE1234567890ULL
#define REQ_POOL_IDX_PADDING 0
#define TOKEN_TO_KV_SLOT_PADDING 0
#define CANARY_FIELDS_PER_SLOT 4
#define CANARY_SLOT_BYTES 32
#define VIOLATION_FIELDS 8
#define MAX_REAL_KV_SOURCES 4
#define REAL_KV_LOAD_BYTES 16

#define SPLITMIX64_MUL1 0xBF58476D1CE4E5B9ULL
#define SPLITMIX64_MUL2 0x94D049BB133111EBULL

#define FIELD_TOKEN 0
#define FIELD_POSITION 1
#define FIELD_PREV_HASH 2
#define FIELD_REAL_KV_HASH 3

#define VFIELD_KERNEL_KIND 0
#define VFIELD_SLOT_IDX 1
#define VFIELD_POSITION 2
#define VFIELD_STORED_TOKEN 3
#define VFIELD_EXPECTED_TOKEN 4
#define VFIELD_STORED_CHAIN_HASH 5
#define VFIELD_EXPECTED_AUX 6
#define VFIELD_FAIL_REASON 7

#define LUT_OUT_OF_RANGE_SLOT (-2)
#define NO_SLOT (-1)

enum CanaryLaunchTag {
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

enum FailReason {
    VERIFY_CHAIN_HASH_MISMATCH = 1,
    VERIFY_POSITION_MISMATCH = 2,
    VERIFY_REAL_KV_HASH_MISMATCH = 4,
    WRITE_TOKEN_MISMATCH = 8,
    WRITE_POSITION_MISMATCH = 16,
    VERIFY_TOKEN_MISMATCH = 32,
    SLOT_OUT_OF_RANGE = 64,
};

enum RealKvHashMode {
    REAL_KV_NONE = 0,
    REAL_KV_PARTIAL = 1,
    REAL_KV_ALL = 2,
};
