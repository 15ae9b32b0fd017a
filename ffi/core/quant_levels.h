// The level tables of the rotated block quantizers (core/quant_rotated.h): the Lloyd-Max
// quantizers of the standard normal distribution with 16 and 256 levels (Max, 1960), solved
// numerically in float64. Only the positive half is stored (the levels are symmetric about 0):
// kLevels<bits>[k] is level k of that half as an integer in units of 2^-16 (rounded to nearest),
// kThresholds<bits>[k] the threshold between positive levels k and k + 1, their midpoint
// (rounded to float32); 0 is the threshold between the halves. These are the Lloyd-Max
// conditions: each level is the mean of N(0, 1) over its cell, each threshold halfway between
// its levels. tests/test_quant_rotated.py solves them again with scipy and checks every constant.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define JAXHC_TABLE __device__ __constant__ const
#else
#define JAXHC_TABLE inline constexpr
#endif

namespace jaxhc {
namespace quant {

JAXHC_TABLE int32_t kLevels4[8] = {
    8414, 25431, 43041, 61757, 82328, 106040, 135595, 179083,
};
JAXHC_TABLE float kThresholds4[7] = {
    0x1.086b42p-2f, 0x1.0b788p-1f, 0x1.995e96p-1f, 0x1.196accp+0f,
    0x1.6fe854p+0f, 0x1.d7f1b4p+0f, 0x1.334d86p+1f,
};
JAXHC_TABLE int32_t kLevels8[128] = {
    554, 1661, 2768, 3875, 4983, 6092, 7201, 8310,
    9421, 10532, 11644, 12758, 13873, 14989, 16106, 17225,
    18346, 19468, 20593, 21719, 22848, 23979, 25112, 26248,
    27386, 28527, 29671, 30818, 31969, 33122, 34279, 35440,
    36604, 37772, 38944, 40120, 41301, 42486, 43676, 44870,
    46070, 47275, 48485, 49700, 50922, 52149, 53382, 54622,
    55868, 57121, 58381, 59648, 60923, 62206, 63496, 64795,
    66102, 67418, 68743, 70078, 71422, 72777, 74142, 75517,
    76904, 78303, 79713, 81136, 82572, 84021, 85484, 86961,
    88454, 89961, 91485, 93025, 94583, 96158, 97753, 99367,
    101001, 102656, 104334, 106034, 107759, 109509, 111286, 113090,
    114923, 116787, 118683, 120612, 122577, 124579, 126621, 128705,
    130833, 133008, 135233, 137511, 139846, 142241, 144702, 147233,
    149839, 152526, 155302, 158174, 161151, 164243, 167461, 170821,
    174337, 178029, 181919, 186036, 190413, 195093, 200130, 205595,
    211583, 218225, 225711, 234330, 244558, 257271, 274373, 301697,
};
JAXHC_TABLE float kThresholds8[127] = {
    0x1.14c57ep-6f, 0x1.14c8dcp-5f, 0x1.9f35b8p-5f, 0x1.14d65ap-4f,
    0x1.5a1896p-4f, 0x1.9f6348p-4f, 0x1.e4b81ep-4f, 0x1.150c68p-3f,
    0x1.37c38cp-3f, 0x1.5a8256p-3f, 0x1.7d49a6p-3f, 0x1.a01a58p-3f,
    0x1.c2f552p-3f, 0x1.e5db76p-3f, 0x1.0466d4p-2f, 0x1.15e666p-2f,
    0x1.276ceap-2f, 0x1.38fad2p-2f, 0x1.4a9098p-2f, 0x1.5c2eb4p-2f,
    0x1.6dd59ep-2f, 0x1.7f85d6p-2f, 0x1.913fd6p-2f, 0x1.a3042p-2f,
    0x1.b4d334p-2f, 0x1.c6ad96p-2f, 0x1.d893cap-2f, 0x1.ea865ap-2f,
    0x1.fc85cep-2f, 0x1.07495ap-1f, 0x1.1056cep-1f, 0x1.196b8cp-1f,
    0x1.2287dep-1f, 0x1.2bac12p-1f, 0x1.34d872p-1f, 0x1.3e0d52p-1f,
    0x1.474bp-1f, 0x1.5091dp-1f, 0x1.59e218p-1f, 0x1.633c2ep-1f,
    0x1.6ca06cp-1f, 0x1.760f3p-1f, 0x1.7f88d4p-1f, 0x1.890dbcp-1f,
    0x1.929e4ap-1f, 0x1.9c3ae6p-1f, 0x1.a5e3f6p-1f, 0x1.af99eap-1f,
    0x1.b95d3p-1f, 0x1.c32e3ap-1f, 0x1.cd0d82p-1f, 0x1.d6fb7ep-1f,
    0x1.e0f8b2p-1f, 0x1.eb059cp-1f, 0x1.f522c8p-1f, 0x1.ff50bep-1f,
    0x1.04c80ap+0f, 0x1.09f0aep+0f, 0x1.0f229ap+0f, 0x1.145e1ep+0f,
    0x1.19a39p+0f, 0x1.1ef348p+0f, 0x1.244d9ep+0f, 0x1.29b2f2p+0f,
    0x1.2f23aap+0f, 0x1.34a028p+0f, 0x1.3a28dap+0f, 0x1.3fbe32p+0f,
    0x1.4560a2p+0f, 0x1.4b10a6p+0f, 0x1.50cebep+0f, 0x1.569b74p+0f,
    0x1.5c7752p+0f, 0x1.6262ecp+0f, 0x1.685ee2p+0f, 0x1.6e6bd6p+0f,
    0x1.748a74p+0f, 0x1.7abb74p+0f, 0x1.80ff98p+0f, 0x1.8757aap+0f,
    0x1.8dc482p+0f, 0x1.944706p+0f, 0x1.9ae026p+0f, 0x1.a190e6p+0f,
    0x1.a85a56p+0f, 0x1.af3d9ep+0f, 0x1.b63bf2p+0f, 0x1.bd56a2p+0f,
    0x1.c48f14p+0f, 0x1.cbe6c6p+0f, 0x1.d35f52p+0f, 0x1.dafa76p+0f,
    0x1.e2ba1p+0f, 0x1.eaa026p+0f, 0x1.f2aee8p+0f, 0x1.fae8b6p+0f,
    0x1.01a816p+1f, 0x1.05f40ep+1f, 0x1.0a59dp+1f, 0x1.0edb1p+1f,
    0x1.1379bp+1f, 0x1.1837c4p+1f, 0x1.1d179ap+1f, 0x1.221bc2p+1f,
    0x1.274722p+1f, 0x1.2c9cf2p+1f, 0x1.3220dep+1f, 0x1.37d70ep+1f,
    0x1.3dc446p+1f, 0x1.43ee02p+1f, 0x1.4a5a9ep+1f, 0x1.51118ap+1f,
    0x1.581b8cp+1f, 0x1.5f832p+1f, 0x1.6754e4p+1f, 0x1.6fa04cp+1f,
    0x1.787882p+1f, 0x1.81f5bep+1f, 0x1.8c374ap+1f, 0x1.976686p+1f,
    0x1.a3bbfcp+1f, 0x1.b187e8p+1f, 0x1.c1421ap+1f, 0x1.d3aa0ep+1f,
    0x1.ea1144p+1f, 0x1.03976ap+2f, 0x1.1948cp+2f,
};

}  // namespace quant
}  // namespace jaxhc
