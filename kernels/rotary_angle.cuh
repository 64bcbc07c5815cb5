// The rotation of rotary position embeddings (kernels/rotary.cu, and a decode step's attention
// with the rotary op fused in front, kernels/attention_decode.cu): pair j of a head of
// head_dim values at position s turns by s x theta^(-2j / head_dim).
//
// Angles reach s radians, far outside the range where the fast sine (--use_fast_math) is
// accurate: each is reduced to [-pi, pi] in double first, and the frequencies are taken in
// double, so fp32 carries only the reduced angle.
#ifndef STOF_KERNELS_ROTARY_ANGLE_CUH
#define STOF_KERNELS_ROTARY_ANGLE_CUH

namespace stof {

// cos and sin of s x theta^(-2j / head_dim), log2_theta = log2(theta).
__device__ __forceinline__ void rotary_angle(long long s, int j, int head_dim, double log2_theta,
                                             float *c, float *sn) {
    const double two_pi = 6.283185307179586476925;
    double angle = (double)s * exp2(-2.0 * j / head_dim * log2_theta);
    angle -= two_pi * rint(angle / two_pi);
    __sincosf((float)angle, sn, c);
}

// The pair (x0, x1) = (x_j, x_{j + head_dim / 2}) rotated by (c, sn).
__device__ __forceinline__ void rotate_pair(float &x0, float &x1, float c, float sn) {
    const float a = x0, b = x1;
    x0 = a * c - b * sn;
    x1 = b * c + a * sn;
}

}  // namespace stof

#endif
