/* Host build of the BPF bucket function, for the agreement test only. */
#include <stdint.h>
#include <linux/types.h>

#include "bucket.h"

uint32_t tailtrap_bucket_index(uint64_t v)
{
	return tt_bucket_index(v);
}
