/*
 * Test programs fail fast at a fault (tests/common/testutil.c): cmocka would catch the SIGSEGV of
 * one test and run the next, which then waits for ever for a lock the faulting test held (on the
 * H200, stale_scenarios and stale_scenarios_fallback hung to their 60 s and 240 s limits so).
 * Here a child runs a group whose first test faults with a lock held and whose second takes that
 * lock: it must die of the fault at once, never reach the second test (an alarm ends it there).
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/common/testutil.h"

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;

static void faults_holding_the_lock(void **state)
{
    (void)state;
    pthread_mutex_lock(&held);
    raise(SIGSEGV); /* as a fault inside a library call that holds its lock */
    pthread_mutex_unlock(&held);
}

static void waits_for_the_lock(void **state)
{
    (void)state;
    pthread_mutex_lock(&held); /* never returns if the group went on after the fault */
    pthread_mutex_unlock(&held);
}

static int group_child(void *arg)
{
    (void)arg;
    alarm(20); /* the hang this test guards against ends as SIGALRM, a failure */
    const struct CMUnitTest tests[] = {cmocka_unit_test(faults_holding_the_lock),
                                       cmocka_unit_test(waits_for_the_lock)};
    (void)_cmocka_run_group_tests("failfast-child", tests, 2, NULL, NULL);
    return 3; /* the group ran to its end: the fault was caught */
}

static void test_fault_ends_the_program(void **state)
{
    (void)state;
    int detail = 0;
    enum tu_child_outcome o = tu_run_child(group_child, NULL, &detail);
    print_message("child: %s %d\n", o == TU_CHILD_SIGNAL ? "killed by signal" : "exited", detail);
    /* A sanitizer's SIGSEGV handler turns the fault into an exit status (ASan: 1, TSan: 66). */
    if (o == TU_CHILD_SIGNAL)
        assert_int_equal(detail, SIGSEGV);
    else
        assert_true(o == TU_CHILD_EXIT && (detail == 1 || detail == 66));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fault_ends_the_program)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
