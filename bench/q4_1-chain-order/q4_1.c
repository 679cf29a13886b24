// The Q4_1 x Q8_1 tile of host/src/engine/backend/packed.rs (PackedQ4_1::tile_rows, 8 rows x
// 16 columns, candle's float steps), written twice in C to time one question: does it matter
// in which order the rows' `vpdpbusd` chains are issued? `v1` interleaves the rows (each
// step of 2 instructions for every row in turn, as the Rust source reads); `v3` finishes each
// row's chain of 8 dependent instructions before the next row's, which is what LLVM emitted
// for the Rust source until `interleave_rows` pinned the order. Single-threaded, 30 matrices
// of 1536x576 (53 MB, more than L2) so the weights stream as in a decode step.
//
//   gcc -O3 -march=native bench/q4_1-chain-order/q4_1.c -o /tmp/q4_1 && /tmp/q4_1 16   # rows: 8, 16, ...
//
// docs/benchmarks.md has the figures (Xeon, Sapphire Rapids: 172-175 against 145 GMAC/s).
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define LINES 5
typedef struct { int n,k,blocks; uint8_t* lines; } W;
typedef struct { int blocks; int32_t* words; float* d; float* s; } Y;

#define R 8
// v1: rows interleaved.
__attribute__((noinline)) void v1(const W* w, const Y* y, int r0, int g, float* out){
  __m512i nib=_mm512_set1_epi8(0x0f);
  __m512 acc[R]; for(int t=0;t<R;t++) acc[t]=_mm512_setzero_ps();
  const uint8_t* group=w->lines+(size_t)g*w->blocks*LINES*64;
  const int32_t* words=y->words+(size_t)r0*y->blocks*8;
  const float* yd=y->d+r0*y->blocks; const float* ys=y->s+r0*y->blocks;
  for(int b=0;b<w->blocks;b++){
    __m512i sums[R]; for(int t=0;t<R;t++) sums[t]=_mm512_setzero_si512();
    const uint8_t* block=group+b*LINES*64;
    for(int j=0;j<4;j++){
      __m512i ww=_mm512_load_si512(block+j*64);
      __m512i lo=_mm512_and_si512(ww,nib), hi=_mm512_and_si512(_mm512_srli_epi16(ww,4),nib);
      for(int t=0;t<R;t++){ const int32_t* row=words+(t*y->blocks+b)*8;
        sums[t]=_mm512_dpbusd_epi32(sums[t],lo,_mm512_set1_epi32(row[j]));
        sums[t]=_mm512_dpbusd_epi32(sums[t],hi,_mm512_set1_epi32(row[4+j])); }
    }
    __m512 dx=_mm512_cvtph_ps(_mm256_load_si256((const void*)(block+256)));
    __m512 mx=_mm512_cvtph_ps(_mm256_load_si256((const void*)(block+256+32)));
    for(int t=0;t<R;t++){ int at=t*y->blocks+b;
      __m512 p=_mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sums[t]),dx),_mm512_set1_ps(yd[at]));
      __m512 q=_mm512_mul_ps(mx,_mm512_set1_ps(ys[at]));
      acc[t]=_mm512_add_ps(acc[t],_mm512_add_ps(p,q)); }
  }
  for(int t=0;t<R;t++) _mm512_storeu_ps(out+(size_t)(r0+t)*w->n+g*16,acc[t]);
}
// v3: each row's chain whole, then the next row.
__attribute__((noinline)) void v3(const W* w, const Y* y, int r0, int g, float* out){
  __m512i nib=_mm512_set1_epi8(0x0f);
  __m512 acc[R]; for(int t=0;t<R;t++) acc[t]=_mm512_setzero_ps();
  const uint8_t* group=w->lines+(size_t)g*w->blocks*LINES*64;
  const int32_t* words=y->words+(size_t)r0*y->blocks*8;
  const float* yd=y->d+r0*y->blocks; const float* ys=y->s+r0*y->blocks;
  for(int b=0;b<w->blocks;b++){
    const uint8_t* block=group+b*LINES*64;
    __m512i u[8];
    for(int j=0;j<4;j++){ __m512i ww=_mm512_load_si512(block+j*64);
      u[j]=_mm512_and_si512(ww,nib); u[4+j]=_mm512_and_si512(_mm512_srli_epi16(ww,4),nib); }
    __m512 dx=_mm512_cvtph_ps(_mm256_load_si256((const void*)(block+256)));
    __m512 mx=_mm512_cvtph_ps(_mm256_load_si256((const void*)(block+256+32)));
    __m512i s[R];
    for(int t=0;t<R;t++){ const int32_t* row=words+(t*y->blocks+b)*8;
      __m512i s0=_mm512_setzero_si512();
      for(int j=0;j<4;j++){ s0=_mm512_dpbusd_epi32(s0,u[j],_mm512_set1_epi32(row[j])); s0=_mm512_dpbusd_epi32(s0,u[4+j],_mm512_set1_epi32(row[4+j])); }
      s[t]=s0; __asm__ volatile("" : "+v"(s[t])); }
    for(int t=0;t<R;t++){ int at=t*y->blocks+b;
      __m512 p=_mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[t]),dx),_mm512_set1_ps(yd[at]));
      __m512 q=_mm512_mul_ps(mx,_mm512_set1_ps(ys[at]));
      acc[t]=_mm512_add_ps(acc[t],_mm512_add_ps(p,q)); }
  }
  for(int t=0;t<R;t++) _mm512_storeu_ps(out+(size_t)(r0+t)*w->n+g*16,acc[t]);
}
typedef void (*K)(const W*,const Y*,int,int,float*);
int main(int argc,char**argv){
  int n=1536,k=576,rows=atoi(argv[1]); int NM=30; W ws[30]; Y y={k/32};
  for(int m=0;m<NM;m++){ W w={n,k,k/32}; w.lines=aligned_alloc(64,(size_t)n/16*w.blocks*LINES*64);
  for(size_t i=0;i<(size_t)n/16*w.blocks*LINES*64;i++) w.lines[i]=rand();
  for(size_t i=0;i<(size_t)n/16*w.blocks;i++){ uint16_t* h=(uint16_t*)(w.lines+i*LINES*64+256); for(int c=0;c<32;c++) h[c]=0x3c00+(rand()&0x1ff);} ws[m]=w;}
  y.words=aligned_alloc(64,rows*y.blocks*8*4); for(int i=0;i<rows*y.blocks*8;i++) y.words[i]=rand();
  y.d=malloc(rows*y.blocks*4+64); y.s=malloc(rows*y.blocks*4+64); for(int i=0;i<rows*y.blocks;i++){y.d[i]=0.01f*(i%7+1); y.s[i]=0.3f*(i%5);}
  float* out=aligned_alloc(64,rows*n*4); float* ref=aligned_alloc(64,rows*n*4);
  for(int g=0;g<n/16;g++) for(int r0=0;r0<rows;r0+=R) v1(&ws[NM-1],&y,r0,g,ref);
  K ks[]={v1,v3}; const char* names[]={"rows interleaved","rows in a row"};
  for(int v=0;v<2;v++){
    double best=1e9;
    for(int rep=0;rep<20;rep++){ double t=now();
      for(int m=0;m<NM;m++) for(int g=0;g<n/16;g++) for(int r0=0;r0<rows;r0+=R) ks[v](&ws[m],&y,r0,g,out);
      double dt=now()-t; if(dt<best)best=dt; }
    int same=memcmp(out,ref,(size_t)rows*n*4)==0;
    printf("%s: min %.1f us per matrix, %.1f GMAC/s, same outputs: %s\n",names[v],best*1e6/NM,(double)NM*rows*n*k/best/1e9,same?"yes":"NO");
  }
}
