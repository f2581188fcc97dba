/* What xseg-replay prints. See report.h. */
#include "tools/replay/report.h"

#include "tools/replay/cards.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const pool_keys[] = {"all", "small_pool", "large_pool"};
static const double GiB = 1073741824.0;

void report_mark_header(FILE *out, size_t label_width, int pool)
{
    char tag[64];
    snprintf(tag, sizeof tag, "Tag (GiB%s)", pool == XSEG_STAT_LARGE_POOL ? ", large pool"
                                             : pool == XSEG_STAT_SMALL_POOL ? ", small pool" : "");
    int w = fprintf(out, "%-*s %10s %10s %14s %10s\n", (int)label_width, tag, "Allocated", "Active",
                    "InactiveSplit", "Reserved");
    for (int i = 1; i < w; i++)
        fputc('-', out);
    fputc('\n', out);
}

void report_mark_row(FILE *out, size_t label_width, const char *label, const xseg_device_stats *ds, int pool)
{
    fprintf(out, "%-*s %10.3f %10.3f %14.3f %10.3f\n", (int)label_width, label,
            (double)ds->allocated_bytes[pool].current / GiB, (double)ds->active_bytes[pool].current / GiB,
            (double)ds->inactive_split_bytes[pool].current / GiB,
            (double)ds->reserved_bytes[pool].current / GiB);
}

void report_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}

void report_mark_jsonl(FILE *out, const char *label, const char *mode, int device)
{
    fputs("{\"mark\": ", out);
    report_json_string(out, label);
    fputs(", \"mode\": ", out);
    report_json_string(out, mode);
    const char *key;
    for (size_t i = 0; xseg_stat_key(i, &key) == XSEG_SUCCESS && key; i++) {
        int64_t v;
        if (xseg_stat(device, key, &v) != XSEG_SUCCESS)
            continue;
        fputs(", ", out);
        report_json_string(out, key);
        fprintf(out, ": %" PRId64, v);
    }
    fputs("}\n", out);
}

/* "51.2 GiB", "812 MiB": one decimal from 10 GiB, two from 1 GiB, MiB below. */
static void human(char *buf, size_t len, int64_t b)
{
    double g = (double)b / GiB;
    if (g >= 10)
        snprintf(buf, len, "%.1f GiB", g);
    else if (g >= 1)
        snprintf(buf, len, "%.2f GiB", g);
    else
        snprintf(buf, len, "%.0f MiB", (double)b / (1 << 20));
}

static int is_classic(const struct run_summary *s) { return !strncmp(s->mode, "classic", 7); }

static const char *const classic_name = "PyTorch's allocator (classic mode, as modelled)";

/* The headline's sizes: "39.88 GiB", "812 MiB" (two decimals, so that 2 MiB steps show). */
static void human2(char *buf, size_t len, uint64_t b)
{
    if (b >= (uint64_t)1 << 30)
        snprintf(buf, len, "%.2f GiB", (double)b / GiB);
    else
        snprintf(buf, len, "%.0f MiB", (double)b / (1 << 20));
}

void report_headline_init(struct report_headline *h, const struct trace *t)
{
    memset(h, 0, sizeof *h);
    for (int i = 0; i < REPORT_WHO; i++)
        h->oom_fits[i] = -1;
    h->spill_fits = -1;
    h->oom_at = trace_oom_point(t, &h->oom_live, &h->oom_request);
    h->nsleeps = trace_count_op(t, TRACE_SLEEP);
    h->ngive_back = trace_count_op(t, TRACE_EMPTY_CACHE) + trace_count_op(t, TRACE_TRIM) + trace_count_op(t, TRACE_IDLE);
}

/* A candidate's smallest device when it has one that fits (0 otherwise). */
static uint64_t cand_device(const struct tune_candidate *c)
{
    return c->failed_allocs || c->stopped ? 0 : c->min_device;
}

/* "39.88 GiB", "at most 39.88 GiB", or why there is none, for the headline. */
static void cand_text(char *buf, size_t len, const struct tune_candidate *c, const char *dev)
{
    char a[32];
    human2(a, sizeof a, c->min_device);
    if (c->failed_allocs)
        snprintf(buf, len, "does not fit the %s device", dev);
    else if (c->stopped || !c->min_device)
        snprintf(buf, len, "no smallest device (a replay stopped, or the budget ran out)");
    else
        snprintf(buf, len, "%s%s", c->device_exact ? "" : "at most ", a);
}

/* The best one-line setting as the user sets it, or "" when the best is the default. */
static void best_line(char *buf, size_t len, const struct tune_family_result *py)
{
    buf[0] = '\0';
    if (py->have_best && py->best.shown[0])
        tune_env_line(py, &py->best, buf, len);
}

/* "Smallest device: xseg X; PyTorch's allocator Y by default (classic), Z with LINE (its best
 * one-line setting, as --tune finds it)." */
static void headline_sentence(char *buf, size_t len, const struct report_headline *h, const char *dev)
{
    const struct tune_family_result *py = &h->tune->fam[0], *xs = &h->tune->fam[1];
    char x[96] = "not measured", c[96], b[96], line[400];
    if (xs->have_def)
        cand_text(x, sizeof x, &xs->def, dev);
    else if (xs->over_budget)
        snprintf(x, sizeof x, "no replay finished within --tune-budget");
    if (!py->have_def) {
        snprintf(buf, len, "Smallest device: xseg %s; PyTorch's allocator: %s.", x,
                 py->over_budget ? "no replay finished within --tune-budget" : "not measured");
        return;
    }
    if (xs->have_def && xs->def.failed_allocs && py->have_best && py->best.failed_allocs) {
        snprintf(buf, len, "Smallest device: none up to the %s device replayed: neither xseg nor PyTorch's allocator "
                 "(by default or with any one-line setting) fits the run there (--device-mem).", dev);
        return;
    }
    cand_text(c, sizeof c, &py->def, dev);
    best_line(line, sizeof line, py);
    char cards[200] = "";
    if (xs->have_def && cand_device(&xs->def))
        replay_cards_sentence(cards, sizeof cards, cand_device(&xs->def));
    if (line[0]) {
        cand_text(b, sizeof b, &py->best, dev);
        snprintf(buf, len, "Smallest device: xseg %s; PyTorch's allocator %s by default (classic), %s with %s (its "
                 "best one-line setting, as --tune finds it).%s", x, c, b, line, cards);
    } else {
        snprintf(buf, len, "Smallest device: xseg %s; PyTorch's allocator %s by default (classic), and no one-line "
                 "setting (PYTORCH_CUDA_ALLOC_CONF) fits it on less (as --tune finds it%s).%s", x, c,
                 h->tune->cut_short ? "; the search was cut short by --tune-budget" : "", cards);
    }
}

/* Two smallest devices closer than this are a tie: one step of the search (2 MiB), or 0.5 % of
 * PyTorch's (a gain a user would not act on: a few MiB on a 40 GiB trace). */
static int devices_tie(uint64_t x, uint64_t b)
{
    uint64_t d = x > b ? x - b : b - x;
    return d <= (uint64_t)2 << 20 || d * 200 <= b;
}

/* xseg against PyTorch's best setting: 1 xseg needs less, 0 a tie (devices_tie), -1 more (or only
 * PyTorch fits), -2 no comparison (a figure is missing, neither fits, or the recording has no
 * history: a segments-only snapshot's replay says nothing of the run's peak). */
static int headline_cmp(const struct report_headline *h, const struct trace_recorded *rec)
{
    if (!h || !h->tune || !h->tune->fam[0].have_best || !h->tune->fam[1].have_def)
        return -2;
    if (rec && rec->history_events == 0)
        return -2;
    uint64_t x = cand_device(&h->tune->fam[1].def), b = cand_device(&h->tune->fam[0].best);
    if (!x && !b)
        return -2;
    if (!x)
        return h->tune->fam[1].def.failed_allocs ? -1 : -2;
    if (!b)
        return h->tune->fam[0].best.failed_allocs ? 1 : -2;
    if (devices_tie(x, b))
        return 0;
    return x < b ? 1 : -1;
}

/* The difference @p d of two devices in @p size ("24 MiB") and as a share of @p of in @p pct
 * ("0.4 %"). */
struct margin {
    char size[32], pct[16];
};
static void margin_of(struct margin *m, uint64_t d, uint64_t of)
{
    human2(m->size, sizeof m->size, d);
    snprintf(m->pct, sizeof m->pct, "%.1f %%", of ? 100.0 * (double)d / (double)of : 0.0);
}

/* The comparison, plainly, with its margin (in MiB and as a share of PyTorch's device). */
static void compare_sentence(char *buf, size_t len, const struct report_headline *h, int cmp)
{
    const struct tune_family_result *py = &h->tune->fam[0], *xs = &h->tune->fam[1];
    uint64_t x = cand_device(&xs->def), b = cand_device(&py->best), c = cand_device(&py->def);
    char line[400], xb[32], bb[32];
    struct margin m1, m2;
    best_line(line, sizeof line, py);
    const char *with = line[0] ? line : "its defaults";
    human2(xb, sizeof xb, x);
    human2(bb, sizeof bb, b);
    if (cmp == 1 && b) {
        margin_of(&m1, b - x, b);
        margin_of(&m2, c > x ? c - x : 0, c);
        if (line[0])
            snprintf(buf, len, "xseg beats PyTorch's best one-line setting: %s less than with %s (%s), %s less "
                     "than PyTorch's default (%s).", m1.size, line, m1.pct, m2.size, m2.pct);
        else
            snprintf(buf, len, "xseg beats PyTorch's allocator: %s less than its default (%s), which no one-line "
                     "setting improves.", m1.size, m1.pct);
    } else if (cmp == 1) {
        snprintf(buf, len, "xseg beats PyTorch's allocator: PyTorch with %s does not fit the device xseg fits.", with);
    } else if (cmp == 0) {
        margin_of(&m1, x > b ? x - b : b - x, b);
        if (x == b)
            snprintf(buf, len, "xseg ties with PyTorch's best setting here: with %s PyTorch fits the same %s device.",
                     with, xb);
        else
            snprintf(buf, len, "xseg ties with PyTorch's best setting here: with %s PyTorch fits %s, xseg %s (%s, "
                     "%s apart: within one 2 MiB step or 0.5 %%).", with, bb, xb, m1.size, m1.pct);
    } else if (x) {
        margin_of(&m1, x - b, b);
        snprintf(buf, len, "xseg does not beat PyTorch's best setting here: with %s PyTorch needs %s less (%s "
                 "against xseg's %s; %s).", with, m1.size, bb, xb, m1.pct);
    } else {
        snprintf(buf, len, "xseg does not beat PyTorch's best setting here: with %s PyTorch fits a %s device, xseg "
                 "does not fit the device replayed.", with, bb);
    }
}

/* What else xseg gives this workload, only where it applies: 0 when nothing does. */
static int extras_sentence(char *buf, size_t len, const struct report_headline *h)
{
    const struct tune_candidate *xs = &h->tune->fam[1].def, *best = &h->tune->fam[0].best;
    size_t k = (size_t)snprintf(buf, len, "What xseg still gives this workload:");
    int n = 0;
    char a[32], b[32];
    if (h->nsleeps && k < len) {
        k += (size_t)snprintf(buf + k, len - k, "%s sleep and wake of a pool at the same addresses (the trace "
                              "sleeps %zu time%s; PyTorch's allocator cannot, classic mode skips them)", n++ ? ";" : "",
                              h->nsleeps, h->nsleeps == 1 ? "" : "s");
    }
    if (h->ngive_back && h->tune->fam[0].have_best && xs->reserved_after_empty_cache >= 0 &&
        xs->reserved_after_empty_cache + (2 << 20) <= best->reserved_after_empty_cache && k < len) {
        human2(a, sizeof a, (uint64_t)xs->reserved_after_empty_cache);
        human2(b, sizeof b, (uint64_t)best->reserved_after_empty_cache);
        k += (size_t)snprintf(buf + k, len - k, "%s more memory given back: after empty_cache xseg keeps %s where "
                              "PyTorch with its best setting keeps %s (xseg unmaps every page without a live byte)",
                              n++ ? ";" : "", a, b);
    }
    if (h->spill_fits == 1 && h->oom_device && k < len) {
        human2(a, sizeof a, h->oom_device);
        human2(b, sizeof b, (uint64_t)(h->spilled_peak > 0 ? h->spilled_peak : 0));
        k += (size_t)snprintf(buf + k, len - k, "%s with spill_to_host:True the run completes on your %s device, "
                              "%s spilled to host memory at the peak (modelled)", n++ ? ";" : "", a, b);
    }
    if (k < len)
        snprintf(buf + k, len - k, ".");
    return n;
}

/* "the 21.70 GiB PyTorch held plus the 252 MiB the driver had free when it failed" */
static void oom_device_origin(char *buf, size_t len, const struct trace_recorded *rec, const struct report_headline *h)
{
    char a[32], b[32];
    if (h->oom_given) {
        snprintf(buf, len, "--device-mem");
    } else if (rec->oom_reserved >= 0 && rec->oom_free >= 0) {
        human2(a, sizeof a, (uint64_t)rec->oom_reserved);
        human2(b, sizeof b, (uint64_t)rec->oom_free);
        snprintf(buf, len, "the %s PyTorch held plus the %s the driver had free when it failed, as the snapshot "
                 "records them", a, b);
    } else {
        snprintf(buf, len, "the memory PyTorch held plus what was free when it failed");
    }
}

/* "On your D device (...), xseg would have avoided this OOM: ...; PyTorch's allocator ... fails
 * there too; with LINE it fits there." */
static void oom_sentence(char *buf, size_t len, const struct trace_recorded *rec, const struct report_headline *h)
{
    char d[32], origin[200], x[160] = "", k[128] = "", bl[512] = "", line[400] = "";
    human2(d, sizeof d, h->oom_device);
    oom_device_origin(origin, sizeof origin, rec, h);
    int xf = h->oom_fits[REPORT_XSEG], cf = h->oom_fits[REPORT_CLASSIC], bf = h->oom_fits[REPORT_BEST];
    if (xf >= 0)
        snprintf(x, sizeof x, "%s", xf ? "xseg would have avoided this OOM: the whole run, the failing request "
                                         "included, fits there"
                                       : "xseg would not have avoided this OOM: an allocation fails there too");
    if (cf >= 0)
        snprintf(k, sizeof k, "%s%s %s there%s", x[0] ? "; " : "", classic_name, cf ? "fits" : "fails",
                 !cf && xf == 0 ? " too" : "");
    if (h->tune)
        best_line(line, sizeof line, &h->tune->fam[0]);
    if (bf >= 0 && line[0])
        snprintf(bl, sizeof bl, "; with %s it %s there", line, bf ? "fits" : "fails");
    snprintf(buf, len, "On your %s device (%s), %s%s%s.", d, origin, x, k, bl);
}

/* The live bytes at the failure against the card, and when nothing fits, the size that would. */
static void oom_live_sentence(char *buf, size_t len, const struct report_headline *h)
{
    char live[32], req[32], sum[32], d[32], fit[64] = "", bfit[96] = "";
    uint64_t need = h->oom_live + h->oom_request;
    human2(live, sizeof live, h->oom_live);
    human2(req, sizeof req, h->oom_request);
    human2(sum, sizeof sum, need);
    human2(d, sizeof d, h->oom_device);
    uint64_t xm = h->tune ? cand_device(&h->tune->fam[1].def) : 0, bm = h->tune ? cand_device(&h->tune->fam[0].best) : 0;
    if (xm)
        human2(fit, sizeof fit, xm);
    if (bm) {
        char b[32];
        human2(b, sizeof b, bm);
        snprintf(bfit, sizeof bfit, "; PyTorch's allocator at its best, %s", b);
    }
    int any_fits = h->oom_fits[REPORT_XSEG] == 1 || h->oom_fits[REPORT_CLASSIC] == 1 || h->oom_fits[REPORT_BEST] == 1;
    int over = need > h->oom_device, none = over || (!any_fits && h->spill_fits != 1);
    size_t k = (size_t)snprintf(buf, len, "At the failure your live tensors held %s and asked for %s more: %s, %s the %s "
                                "device%s", live, req, sum, over ? "more than" : "of", d,
                                over ? " has, so no allocator setting can fit this run there."
                                : none ? "; no setting tried fits the run there (the rest is the allocator's layout)."
                                       : ".");
    if (none && fit[0] && k < len)
        snprintf(buf + k, len - k, " A device of %s would (xseg's smallest device%s).", fit, bfit);
}

/* The reserved-memory sentences, on the device replayed. A recording made with expandable
 * segments is compared with expandable mode only: classic mode is another allocator mode, and
 * the gap between two modes is no model error. */
/* ", and 39.9 GiB with LINE (its best one-line setting, as modelled)" when --tune's search found a
 * best setting other than the default and replayed it on the device (else ""): the reserved
 * comparison names PyTorch's best setting as the verdict does, not its default alone. */
static void best_reserved_clause(char *buf, size_t len, const struct report_headline *h)
{
    buf[0] = '\0';
    if (!h || !h->tune || !h->tune->fam[0].have_best)
        return;
    const struct tune_candidate *best = &h->tune->fam[0].best;
    char line[400], r[32];
    best_line(line, sizeof line, &h->tune->fam[0]);
    if (!line[0] || best->peak_reserved <= 0 || best->failed_allocs)
        return;
    human(r, sizeof r, best->peak_reserved);
    snprintf(buf, len, ", and %s with %s (its best one-line setting, as modelled)", r, line);
}

static size_t reserved_sentences(const struct run_summary *xs, const struct run_summary *cl, size_t n,
                                 const struct run_summary *s, const struct trace_recorded *rec,
                                 const struct report_headline *h, const char *where,
                                 char lines[][REPORT_VERDICT_MAX], size_t k, size_t maxlines)
{
    char a[32], b[32], best[480];
    int have_rec = rec && rec->peak_reserved > 0;
    int rec_exp = have_rec && rec->expandable == 1;
    if (xs && (have_rec || cl) && k < maxlines) {
        human(a, sizeof a, xs->peak_reserved);
        human(b, sizeof b, have_rec ? rec->peak_reserved : cl->peak_reserved);
        best_reserved_clause(best, sizeof best, h);
        snprintf(lines[k++], REPORT_VERDICT_MAX, "%sOn the %s, xseg reserves %s at its peak where %s %s %s%s%s.",
                 rec_exp ? "PyTorch ran with expandable segments (the snapshot says so), compared here with expandable "
                           "mode. " : "",
                 where, a, have_rec ? "PyTorch's allocator" : classic_name,
                 have_rec ? "reserved" : "reserves", b, have_rec ? " (recorded)" : "", best);
    }
    if (cl && have_rec && !rec_exp && k < maxlines) {
        human(a, sizeof a, cl->peak_reserved);
        human(b, sizeof b, rec->peak_reserved);
        snprintf(lines[k++], REPORT_VERDICT_MAX,
                 "Classic mode, PyTorch's allocator as modelled, reserves %s where the recording shows %s "
                 "(%+.1f %%).", a, b, 100.0 * (double)(cl->peak_reserved - rec->peak_reserved) / (double)rec->peak_reserved);
    }
    if (n == 1 && !(xs && have_rec) && !(cl && have_rec) && k < maxlines) {
        human(a, sizeof a, s[0].peak_reserved);
        human(b, sizeof b, s[0].peak_allocated);
        snprintf(lines[k++], REPORT_VERDICT_MAX, "On the %s, %s reserves %s at its peak for %s allocated%s.", where,
                 xs ? "xseg" : classic_name, a, b,
                 s[0].have_calls ? " (--min-device: the smallest device it fits on)" : "");
    }
    return k;
}

/* The device-size sentence without a headline (one mode, a config of the user's), from each
 * mode's smallest device (--min-device's bisection). */
static void device_sentence(char *buf, size_t len, const struct run_summary *xs, const struct run_summary *cl)
{
    char a[32] = "", b[32] = "";
    if (xs && xs->min_device)
        human2(a, sizeof a, xs->min_device);
    if (cl && cl->min_device)
        human2(b, sizeof b, cl->min_device);
    if (a[0] && b[0])
        snprintf(buf, len, "Smallest device: xseg %s, %s %s (as --min-device finds them).", a, classic_name, b);
    else
        snprintf(buf, len, "Smallest device: %s %s (as --min-device finds it).", a[0] ? "xseg" : classic_name,
                 a[0] ? a : b);
}

/* The OOM's answer first, then the headline. */
static size_t oom_and_headline(const struct run_summary *xs, const struct run_summary *cl,
                               const struct trace_recorded *rec, const struct report_headline *h, const char *dev,
                               char lines[][REPORT_VERDICT_MAX], size_t k, size_t maxlines)
{
    if (rec && (rec->noom || rec->oom_device >= 0) && k < maxlines) {
        if (h && h->oom_device) {
            oom_sentence(lines[k++], REPORT_VERDICT_MAX, rec, h);
            if (h->oom_at != SIZE_MAX && h->oom_live && k < maxlines)
                oom_live_sentence(lines[k++], REPORT_VERDICT_MAX, h);
        } else {
            snprintf(lines[k++], REPORT_VERDICT_MAX, "This run ended in an OOM on a device of unknown size: "
                     "--device-mem SIZE (your device's memory) answers whether xseg would have avoided it.");
        }
    }
    if (h && h->tune) {
        if (k < maxlines)
            headline_sentence(lines[k++], REPORT_VERDICT_MAX, h, dev);
        int cmp = headline_cmp(h, rec);
        if (cmp != -2 && k < maxlines)
            compare_sentence(lines[k++], REPORT_VERDICT_MAX, h, cmp);
        if (cmp != -2 && cmp < 1 && k < maxlines && extras_sentence(lines[k], REPORT_VERDICT_MAX, h))
            k++;
    } else if (((xs && xs->min_device) || (cl && cl->min_device)) && k < maxlines) {
        device_sentence(lines[k++], REPORT_VERDICT_MAX, xs, cl);
    }
    return k;
}

size_t report_verdict(const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                      const struct report_headline *h, char lines[][REPORT_VERDICT_MAX], size_t maxlines)
{
    const struct run_summary *cl = NULL, *xs = NULL;
    for (size_t m = 0; m < n; m++) {
        if (is_classic(&s[m]) && !cl)
            cl = &s[m];
        else if (!is_classic(&s[m]) && !xs)
            xs = &s[m];
    }
    size_t k = 0;
    char dev[32] = "";
    if (s[0].device_bytes)
        human(dev, sizeof dev, (int64_t)s[0].device_bytes);
    if (rec && rec->history_events == 0 && k < maxlines)
        snprintf(lines[k++], REPORT_VERDICT_MAX, "Warning: this snapshot has no allocation history (segments only: "
                 "it was taken without torch.cuda.memory._record_memory_history()), so the replay allocates only "
                 "what was live when it was taken: its figures say nothing of the run's peak or fragmentation.");
    /* A replay on a GPU (no emulator call counts) ran on the GPU's memory, and no search was made. */
    const int on_gpu = !s[0].have_calls;
    char where[48];
    snprintf(where, sizeof where, "%s%s", dev, dev[0] ? " device" : on_gpu ? "GPU" : "emulated device");
    if (on_gpu && !h && k < maxlines)
        snprintf(lines[k++], REPORT_VERDICT_MAX, "Smallest device: not searched, as these replays ran on a GPU, "
                 "whose memory is what it is: the search replays on emulated devices of each size (run where no "
                 "GPU is found, or with XSEG_LIBCUDA set to libcudaemu.so).");
    k = oom_and_headline(xs, cl, rec, h, dev, lines, k, maxlines);
    k = reserved_sentences(xs, cl, n, s, rec, h, where, lines, k, maxlines);
    for (size_t m = 0; m < n && k < maxlines; m++)
        if (s[m].failed_allocs)
            snprintf(lines[k++], REPORT_VERDICT_MAX,
                     "In %s mode %llu allocation%s failed on the %s%s%s: the run does not fit there.", s[m].mode,
                     (unsigned long long)s[m].failed_allocs, s[m].failed_allocs > 1 ? "s" : "", dev,
                     dev[0] ? " " : "", on_gpu ? "GPU" : "emulated device (--device-mem)");
    return k;
}

const char *report_outcome(const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                           const struct report_headline *h)
{
    const struct run_summary *xs = NULL, *cl = NULL;
    for (size_t m = 0; m < n; m++) {
        if (is_classic(&s[m]) && !cl)
            cl = &s[m];
        else if (!is_classic(&s[m]) && !xs)
            xs = &s[m];
    }
    const struct run_summary *own = xs ? xs : cl;
    if (!own)
        return "same";
    if (own->failed_allocs || (h && h->oom_device && h->oom_fits[REPORT_XSEG] == 0))
        return "fail";
    int cmp = headline_cmp(h, rec);
    if (cmp != -2)
        return cmp > 0 ? "good" : cmp == 0 ? "same" : "worse";
    int64_t base = rec && rec->peak_reserved > 0 ? rec->peak_reserved : own != cl && cl ? cl->peak_reserved : -1;
    if (own != cl && cl && cl->failed_allocs && !(rec && rec->peak_reserved > 0))
        return "good";
    if (base < 0 || own->peak_reserved == base)
        return "same";
    return own->peak_reserved > base ? "worse" : "good";
}

/* Apart from the requests' peak @p req by more than one 2 MiB step and 0.5 % (the verdicts' tie). */
static int peak_apart(int64_t x, int64_t req)
{
    int64_t d = x > req ? x - req : req - x;
    return d > (2 << 20) && (double)d > 0.005 * (double)req;
}

/* "+0.852 GiB" / "-12 MiB": @p x against @p req. */
static void peak_delta(char *buf, size_t len, int64_t x, int64_t req)
{
    char h[32];
    human2(h, sizeof h, (uint64_t)(x > req ? x - req : req - x));
    snprintf(buf, len, "%c%s", x > req ? '+' : '-', h);
}

size_t report_peak_note(const struct run_summary *s, size_t n, const struct trace_recorded *rec, char *buf,
                        size_t len)
{
    buf[0] = 0;
    int64_t req = n ? s[0].peak_requested : 0;
    if (req <= 0)
        return 0;
    char part[REPORT_PEAK_NOTE_MAX] = "", d[40], h[32];
    size_t k = 0;
    for (size_t m = 0; m < n && k < sizeof part; m++) {
        if (!peak_apart(s[m].peak_allocated, req))
            continue;
        peak_delta(d, sizeof d, s[m].peak_allocated, req);
        const char *why = s[m].peak_allocated < req && s[m].failed_allocs
                              ? "its failed allocations hold nothing"
                          : !strncmp(s[m].mode, "classic", 7)
                              ? "a large block is handed out whole where 1 MiB or less of it would be left"
                              : "blocks larger than their requests (a rounding or split setting)";
        k += (size_t)snprintf(part + k, sizeof part - k, "; %s %s: %s", s[m].mode, d, why);
    }
    if (rec && rec->peak_allocated >= 0 && peak_apart(rec->peak_allocated, req) && k < sizeof part) {
        peak_delta(d, sizeof d, rec->peak_allocated, req);
        k += (size_t)snprintf(part + k, sizeof part - k, "; PyTorch (recorded) %s: the blocks of its own run%s", d,
                              rec->expandable == 0 ? ", classic, with the same whole blocks" : "");
    }
    if (!k)
        return 0;
    human2(h, sizeof h, (uint64_t)req);
    int w = snprintf(buf, len,
                     "Peak allocated is PyTorch's max_memory_allocated of each run: the blocks as handed out. "
                     "The requests themselves, each rounded up to 512 B, peak at %s%s. What a device must hold "
                     "is the requests, so the smallest device may lie below a peak allocated above.",
                     h, part);
    return w < 0 ? 0 : (size_t)w < len ? (size_t)w : len - 1;
}

static void peak_note_text(FILE *out, const struct run_summary *s, size_t n, const struct trace_recorded *rec)
{
    char note[REPORT_PEAK_NOTE_MAX];
    if (report_peak_note(s, n, rec, note, sizeof note))
        fprintf(out, "%s\n", note);
}

static void verdict_text(FILE *out, const struct run_summary *s, size_t n, const struct trace_recorded *rec,
                         const struct report_headline *h)
{
    char lines[REPORT_VERDICT_LINES][REPORT_VERDICT_MAX];
    size_t k = report_verdict(s, n, rec, h, lines, REPORT_VERDICT_LINES);
    for (size_t i = 0; i < k; i++)
        fprintf(out, "%s\n", lines[i]);
}

static const char *const emulator_note =
    "(emulator figures: cudaemu's host time includes the driver time it models, not a GPU's)";

void report_summary_text(FILE *out, const struct run_summary *s, const struct trace_recorded *rec,
                         int driver_stats)
{
    verdict_text(out, s, 1, rec, NULL);
    fprintf(out, "%s [%s]\n", s->trace, s->mode);
    fprintf(out, "  %-28s %" PRIu64 " (allocs %" PRIu64 ", frees %" PRIu64 ", failed allocs %" PRIu64 ")\n",
            "actions", s->actions, s->allocs, s->frees, s->failed_allocs);
    fprintf(out, "  %-28s %.3f GiB", "peak allocated", (double)s->peak_allocated / GiB);
    if (rec && rec->peak_allocated >= 0)
        fprintf(out, " (PyTorch recorded %.3f GiB)", (double)rec->peak_allocated / GiB);
    fprintf(out, "\n  %-28s %.3f GiB", "peak reserved", (double)s->peak_reserved / GiB);
    if (rec && rec->peak_reserved >= 0)
        fprintf(out, " (PyTorch recorded %.3f GiB)", (double)rec->peak_reserved / GiB);
    fprintf(out, "\n  %-28s %.4f\n", "utilization", s->utilization);
    peak_note_text(out, s, 1, rec);
    fprintf(out, "  %-28s %.3f GiB\n", "reserved at the end", (double)s->reserved_end / GiB);
    fprintf(out, "  %-28s %.3f GiB\n", "reserved after empty_cache", (double)s->reserved_after_empty_cache / GiB);
    if (s->spills)
        fprintf(out, "  %-28s %.3f GiB at the peak, %" PRIu64 " pages spilled, %" PRIu64 " promoted, %.3f GiB "
                     "copied: %.1f ms of link time at %.0f GB/s (modelled); %" PRIu64 " waits for the device\n",
                "spilled to host", (double)s->spilled_peak / GiB, s->spills, s->promotions,
                (double)s->spill_copied / GiB, 1e3 * (double)s->spill_copied / (REPORT_LINK_GBPS * 1e9),
                REPORT_LINK_GBPS, s->spill_syncs);
    if (!driver_stats)
        return;
    if (s->have_calls)
        fprintf(out, "  %s\n", emulator_note);
    fprintf(out, "  %-28s %.0f ns per alloc, %.0f ns per free\n", "host time", s->host_ns_per_alloc,
            s->host_ns_per_free);
    if (!s->have_calls) {
        fprintf(out, "  %-28s n/a (the real driver has no call counters)\n", "driver calls");
        return;
    }
    fprintf(out, "  %-28s", "driver calls");
    int any = 0;
    for (int e = 0; e < RUN_NENTRIES; e++)
        if (s->calls[e]) {
            fprintf(out, "%s %s %" PRIu64, any ? "," : "", run_entry_names[e], s->calls[e]);
            any = 1;
        }
    fprintf(out, "%s\n", any ? "" : " none");
    if (s->peak_reserved)
        fprintf(out, "  %-28s %.1f\n", "memory calls per GiB reserved",
                (double)s->memory_calls / ((double)s->peak_reserved / GiB));
}

void report_summary_json(FILE *out, const struct run_summary *s)
{
    fputs("{\"mode\": ", out);
    report_json_string(out, s->mode);
    fputs(", \"trace\": ", out);
    report_json_string(out, s->trace);
    fprintf(out, ", \"actions\": %" PRIu64 ", \"allocs\": %" PRIu64 ", \"frees\": %" PRIu64
                 ", \"failed_allocs\": %" PRIu64, s->actions, s->allocs, s->frees, s->failed_allocs);
    fprintf(out, ", \"peak_allocated_bytes\": %" PRId64 ", \"peak_reserved_bytes\": %" PRId64
                 ", \"utilization\": %.6f, \"reserved_end_bytes\": %" PRId64
                 ", \"reserved_after_empty_cache_bytes\": %" PRId64,
            s->peak_allocated, s->peak_reserved, s->utilization, s->reserved_end,
            s->reserved_after_empty_cache);
    fprintf(out, ", \"peak_requested_bytes\": %" PRId64, s->peak_requested);
    fprintf(out, ", \"host_ns_per_alloc\": %.1f, \"host_ns_per_free\": %.1f", s->host_ns_per_alloc,
            s->host_ns_per_free);
    fprintf(out, ", \"spilled_peak_bytes\": %" PRId64 ", \"num_spills\": %" PRIu64 ", \"num_promotions\": %" PRIu64
                 ", \"spill_copied_bytes\": %" PRId64 ", \"spill_link_seconds\": %.6f, \"spill_context_syncs\": %" PRIu64,
            s->spilled_peak, s->spills, s->promotions, s->spill_copied,
            (double)s->spill_copied / (REPORT_LINK_GBPS * 1e9), s->spill_syncs);
    if (s->have_calls) {
        fputs(", \"driver_calls\": {", out);
        for (int e = 0; e < RUN_NENTRIES; e++)
            fprintf(out, "%s\"%s\": %" PRIu64, e ? ", " : "", run_entry_names[e], s->calls[e]);
        fprintf(out, "}, \"driver_memory_calls\": %" PRIu64, s->memory_calls);
    } else {
        fputs(", \"driver_calls\": null", out);
    }
    /* The first failed allocations' action indices, keyed by rank (the reader is flat). */
    fputs(", \"failed_at\": {", out);
    for (uint64_t i = 0; i < s->failed_allocs && i < RUN_FAILED_AT_MAX; i++)
        fprintf(out, "%s\"%" PRIu64 "\": %" PRIu64, i ? ", " : "", i, s->failed_at[i]);
    fputs("}}\n", out);
}

static void gib_cell(char *buf, size_t len, int64_t v) { snprintf(buf, len, "%.3f", (double)v / GiB); }

/* The marks of @p n modes side by side: the mode name over its four columns. */
static void compare_marks(FILE *out, const struct run_summary *s, struct report_mark *const *marks,
                          const size_t *nmarks, size_t n, int pool)
{
    size_t nm = 0, lw = 24;
    for (size_t m = 0; m < n; m++) {
        nm = nm > nmarks[m] ? nm : nmarks[m];
        for (size_t i = 0; i < nmarks[m]; i++)
            lw = strlen(marks[m][i].label) > lw ? strlen(marks[m][i].label) : lw;
    }
    if (!nm)
        return;
    fprintf(out, "%-*s", (int)lw, "");
    for (size_t m = 0; m < n; m++)
        fprintf(out, " | %-41s", s[m].mode);
    fputc('\n', out);
    char tag[64];
    snprintf(tag, sizeof tag, "Tag (GiB%s)", pool == XSEG_STAT_LARGE_POOL ? ", large pool"
                                             : pool == XSEG_STAT_SMALL_POOL ? ", small pool" : "");
    int w = fprintf(out, "%-*s", (int)lw, tag);
    for (size_t m = 0; m < n; m++)
        w += fprintf(out, " | %9s %9s %9s %9s", "Allocated", "Active", "InactSplit", "Reserved");
    fputc('\n', out);
    for (int i = 1; i < w; i++)
        fputc('-', out);
    fputc('\n', out);
    for (size_t i = 0; i < nm; i++) {
        const char *label = "";
        for (size_t m = 0; m < n; m++)
            if (i < nmarks[m]) {
                label = marks[m][i].label;
                break;
            }
        fprintf(out, "%-*s", (int)lw, label);
        for (size_t m = 0; m < n; m++) {
            if (i >= nmarks[m]) {
                fprintf(out, " | %39s", "(stopped)");
                continue;
            }
            fprintf(out, " |");
            for (int k = 0; k < 4; k++)
                fprintf(out, " %9.3f", (double)marks[m][i].v[k] / GiB);
        }
        fputc('\n', out);
    }
    fputc('\n', out);
}

#define ROW(label, fmtexpr, rec_cell)                                                             \
    do {                                                                                          \
        fprintf(out, "%-32s", label);                                                             \
        for (size_t m = 0; m < n; m++) {                                                          \
            char cell[40];                                                                        \
            const struct run_summary *x = &s[m];                                                  \
            fmtexpr;                                                                              \
            fprintf(out, " %14s", cell);                                                          \
        }                                                                                         \
        if (rec_on) {                                                                             \
            char cell[40] = "-";                                                                  \
            rec_cell;                                                                             \
            fprintf(out, " %20s", cell);                                                          \
        }                                                                                         \
        fputc('\n', out);                                                                         \
    } while (0)

/* Host time and driver calls: figures of the replay machine, behind --driver-stats. */
static void compare_driver_stats(FILE *out, const struct run_summary *s, size_t n)
{
    const int rec_on = 0;
    int have = 0;
    for (size_t m = 0; m < n; m++)
        have |= s[m].have_calls;
    fprintf(out, "%s\n", have ? emulator_note : "(host time on the real driver)");
    ROW("host ns per alloc", snprintf(cell, sizeof cell, "%.0f", x->host_ns_per_alloc), (void)0);
    ROW("host ns per free", snprintf(cell, sizeof cell, "%.0f", x->host_ns_per_free), (void)0);
    if (!have) {
        fprintf(out, "%-32s n/a (the real driver has no call counters)\n", "driver calls");
        return;
    }
    for (int e = 0; e < RUN_NENTRIES; e++) {
        uint64_t any = 0;
        for (size_t m = 0; m < n; m++)
            any |= s[m].calls[e];
        if (!any)
            continue;
        char label[48];
        snprintf(label, sizeof label, "  %s", run_entry_names[e]);
        ROW(label, snprintf(cell, sizeof cell, "%" PRIu64, x->calls[e]), (void)0);
    }
    ROW("memory calls per GiB reserved",
        snprintf(cell, sizeof cell, "%.1f",
                 x->peak_reserved ? (double)x->memory_calls / ((double)x->peak_reserved / GiB) : 0.0),
        (void)0);
}

void report_compare_text(FILE *out, const char *trace, const struct run_summary *s,
                         struct report_mark *const *marks, const size_t *nmarks, size_t n, int pool,
                         const struct trace_recorded *rec, const struct report_headline *h, int driver_stats)
{
    fprintf(out, "== %s\n", trace);
    verdict_text(out, s, n, rec, h);
    fputc('\n', out);
    compare_marks(out, s, marks, nmarks, n, pool);
    const int rec_on = rec && rec->peak_reserved >= 0;
    /* The header's first cell says which device these columns were replayed on: an OOM's answer
     * above speaks of the device the run failed on, which may be another. */
    char dev[32] = "", on[40];
    if (s[0].device_bytes)
        human(dev, sizeof dev, (int64_t)s[0].device_bytes);
    snprintf(on, sizeof on, "on the %s%s", dev[0] ? dev : s[0].have_calls ? "emulated device" : "GPU",
             dev[0] ? " device" : "");
    fprintf(out, "%-32s", on);
    for (size_t m = 0; m < n; m++)
        fprintf(out, " %14s", s[m].mode);
    if (rec_on)
        fprintf(out, " %20s", "PyTorch (recorded)");
    fputc('\n', out);
    ROW("peak allocated (GiB)", gib_cell(cell, sizeof cell, x->peak_allocated),
        if (rec->peak_allocated >= 0) gib_cell(cell, sizeof cell, rec->peak_allocated));
    ROW("peak reserved (GiB)", gib_cell(cell, sizeof cell, x->peak_reserved),
        gib_cell(cell, sizeof cell, rec->peak_reserved));
    ROW("utilization", snprintf(cell, sizeof cell, "%.4f", x->utilization),
        if (rec->peak_allocated >= 0 && rec->peak_reserved > 0)
            snprintf(cell, sizeof cell, "%.4f", (double)rec->peak_allocated / (double)rec->peak_reserved));
    ROW("reserved at the end (GiB)", gib_cell(cell, sizeof cell, x->reserved_end), (void)0);
    ROW("reserved after empty_cache", gib_cell(cell, sizeof cell, x->reserved_after_empty_cache), (void)0);
    ROW("failed allocs", snprintf(cell, sizeof cell, "%" PRIu64, x->failed_allocs), (void)0);
    if (driver_stats)
        compare_driver_stats(out, s, n);
    peak_note_text(out, s, n, rec);
    fputc('\n', out);
}
#undef ROW

/* ---- reading the child's JSON back ---- */

struct jp {
    const char *s;
};

static void jp_ws(struct jp *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        p->s++;
}

/* A string into @p buf (truncated); \uXXXX outside ASCII becomes '?'. */
static int jp_string(struct jp *p, char *buf, size_t len)
{
    if (*p->s != '"')
        return -1;
    p->s++;
    size_t n = 0;
    while (*p->s && *p->s != '"') {
        char c = *p->s++;
        if (c == '\\') {
            char e = *p->s++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *p->s++;
                    v = v * 16 + (unsigned)(h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                                            : h >= 'A' && h <= 'F' ? h - 'A' + 10 : 0);
                    if (!h)
                        return -1;
                }
                c = v < 0x80 ? (char)v : '?';
                break;
            }
            case '\0': return -1;
            default: c = e;
            }
        }
        if (n + 1 < len)
            buf[n++] = c;
    }
    if (*p->s != '"')
        return -1;
    p->s++;
    buf[n] = '\0';
    return 0;
}

static int jp_object(struct jp *p, const char *prefix, int depth, report_json_fn fn, void *user)
{
    jp_ws(p);
    if (*p->s != '{' || depth > 1)
        return -1;
    p->s++;
    jp_ws(p);
    if (*p->s == '}') {
        p->s++;
        return 0;
    }
    for (;;) {
        char key[160], full[330], str[512];
        jp_ws(p);
        if (jp_string(p, key, sizeof key))
            return -1;
        snprintf(full, sizeof full, "%s%s%s", prefix, *prefix ? "." : "", key);
        jp_ws(p);
        if (*p->s++ != ':')
            return -1;
        jp_ws(p);
        if (*p->s == '{') {
            if (jp_object(p, full, depth + 1, fn, user))
                return -1;
        } else if (*p->s == '"') {
            if (jp_string(p, str, sizeof str))
                return -1;
            fn(full, NAN, str, user);
        } else if (!strncmp(p->s, "null", 4)) {
            p->s += 4;
            fn(full, NAN, NULL, user);
        } else if (!strncmp(p->s, "true", 4) || !strncmp(p->s, "false", 5)) {
            fn(full, *p->s == 't' ? 1 : 0, NULL, user);
            p->s += *p->s == 't' ? 4 : 5;
        } else {
            char *end;
            double v = strtod(p->s, &end);
            if (end == p->s)
                return -1;
            p->s = end;
            fn(full, v, NULL, user);
        }
        jp_ws(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s == '}') {
            p->s++;
            return 0;
        }
        return -1;
    }
}

int report_json_parse(const char *line, report_json_fn fn, void *user)
{
    struct jp p = {line};
    if (jp_object(&p, "", 0, fn, user))
        return -1;
    jp_ws(&p);
    return *p.s ? -1 : 0;
}

void report_summary_from_json(const char *key, double num, const char *str, void *user)
{
    struct run_summary *s = user;
    if (!strcmp(key, "mode") && str)
        snprintf(s->mode, sizeof s->mode, "%s", str);
    else if (!strcmp(key, "trace") && str)
        snprintf(s->trace, sizeof s->trace, "%s", str);
    else if (!strcmp(key, "actions")) s->actions = (uint64_t)num;
    else if (!strcmp(key, "allocs")) s->allocs = (uint64_t)num;
    else if (!strcmp(key, "frees")) s->frees = (uint64_t)num;
    else if (!strcmp(key, "failed_allocs")) s->failed_allocs = (uint64_t)num;
    else if (!strcmp(key, "peak_allocated_bytes")) s->peak_allocated = (int64_t)num;
    else if (!strcmp(key, "peak_reserved_bytes")) s->peak_reserved = (int64_t)num;
    else if (!strcmp(key, "peak_requested_bytes")) s->peak_requested = (int64_t)num;
    else if (!strcmp(key, "utilization")) s->utilization = num;
    else if (!strcmp(key, "reserved_end_bytes")) s->reserved_end = (int64_t)num;
    else if (!strcmp(key, "reserved_after_empty_cache_bytes")) s->reserved_after_empty_cache = (int64_t)num;
    else if (!strcmp(key, "host_ns_per_alloc")) s->host_ns_per_alloc = num;
    else if (!strcmp(key, "host_ns_per_free")) s->host_ns_per_free = num;
    else if (!strcmp(key, "driver_memory_calls")) s->memory_calls = (uint64_t)num;
    else if (!strcmp(key, "spilled_peak_bytes")) s->spilled_peak = (int64_t)num;
    else if (!strcmp(key, "num_spills")) s->spills = (uint64_t)num;
    else if (!strcmp(key, "num_promotions")) s->promotions = (uint64_t)num;
    else if (!strcmp(key, "spill_copied_bytes")) s->spill_copied = (int64_t)num;
    else if (!strncmp(key, "failed_at.", 10)) {
        unsigned long i = strtoul(key + 10, NULL, 10);
        if (i < RUN_FAILED_AT_MAX)
            s->failed_at[i] = (uint64_t)num;
    } else if (!strncmp(key, "driver_calls.", 13)) {
        for (int e = 0; e < RUN_NENTRIES; e++)
            if (!strcmp(key + 13, run_entry_names[e])) {
                s->calls[e] = (uint64_t)num;
                s->have_calls = 1;
            }
    }
}

void report_mark_from_json(const char *key, double num, const char *str, void *user)
{
    struct report_mark_reader *r = user;
    static const char *const stat[4] = {"allocated_bytes", "active_bytes", "inactive_split_bytes",
                                        "reserved_bytes"};
    if (!strcmp(key, "mark") && str) {
        snprintf(r->m->label, sizeof r->m->label, "%s", str);
        r->is_mark = 1;
        return;
    }
    if (!strcmp(key, "mode") && str) {
        snprintf(r->mode, sizeof r->mode, "%s", str);
        return;
    }
    for (int k = 0; k < 4; k++) {
        char want[96];
        snprintf(want, sizeof want, "%s.%s.current", stat[k], pool_keys[r->pool]);
        if (!strcmp(key, want))
            r->m->v[k] = (int64_t)num;
    }
}
