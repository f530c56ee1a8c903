// Closes the region avx512_region_begin.h opened.
// No include guard: it pairs with one begin.
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
