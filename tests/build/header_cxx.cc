// The public header must compile on its own as C++ (PyTorch extensions include it).
#include "xseg.h"

int main()
{
    xseg_stat_counter c = {};
    return static_cast<int>(c.current);
}
