/* Host build of the BPF bucket function, for the agreement test only. */
#include <stdint.h>

typedef uint32_t __u32;
typedef uint64_t __u64;

#include "bucket.h"

uint32_t tailtrap_bucket_index(uint64_t v)
{
	return tt_bucket_index(v);
}
