/*
 * test_reason.c - every fallback reason has a distinct name and a text.
 */
#include "check.h"
#include "reason.h"

#include <string.h>

int main(void)
{
	for (int i = 0; i < R_COUNT; i++) {
		CHECK(reason_id(i) && strcmp(reason_id(i), "unknown") != 0);
		CHECK(reason_text(i) && *reason_text(i));
		for (int j = 0; j < i; j++)
			CHECK(strcmp(reason_id(i), reason_id(j)) != 0);
	}
	CHECK(strcmp(reason_id(-1), "unknown") == 0);
	CHECK(strcmp(reason_id(R_COUNT), "unknown") == 0);
	CHECK(strcmp(reason_id(R_IO_URING), "io-uring") == 0);
	return check_report("test_reason");
}
